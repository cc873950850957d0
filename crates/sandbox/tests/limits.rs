//! Memory, file-size, disk and /tmp limits: a command that tries to take the machine's
//! memory or fill its disk is stopped, and says so.

use frognano_sandbox::{Command, Limit, Sandbox, SandboxSpec};
use std::path::Path;

use crate::cgroup_setup;
use std::time::Duration;

fn sandbox(spec: SandboxSpec) -> Sandbox {
    Sandbox::new(spec.timeout(Duration::from_secs(30)))
        .expect("bubblewrap must work for these tests; run scripts/ci-setup.sh")
}

/// A workspace outside the host's /tmp, on the disk a user's repository would be on.
fn workspace() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn size_of(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.metadata().map(|m| m.len()).unwrap_or(0)).sum()
}

#[test]
fn a_4_gib_allocation_fails_under_a_512_mib_limit() {
    let ws = workspace();
    let sb = sandbox(SandboxSpec::new(ws.path()).memory_limit(512 << 20));
    if !sb.memory_limit_enforced() {
        cgroup_setup::skip_without_cgroup("memory", "a_4_gib_allocation_fails_under_a_512_mib_limit");
        return;
    }
    let out =
        sb.run(&Command::bash("python3 -c 'b = bytearray(4 << 30); print(\"allocated\")'; echo exit=$?")).unwrap();
    assert!(!out.stdout.contains("allocated"), "{out:?}");
    assert!(out.stdout.contains("exit=137") || out.stdout.contains("exit=1\n"), "{out:?}");
    assert_eq!(out.limit_hit, Some(Limit::Memory), "{out:?}");
    assert!(out.stderr.contains("frognano-sandbox: 1 process(es) killed: out of memory"), "{}", out.stderr);
    // The sandbox itself goes on working.
    assert_eq!(sb.run(&Command::new("echo").arg("fine")).unwrap().stdout, "fine\n");
}

#[test]
fn huge_files_cannot_be_written() {
    let ws = workspace();
    let sb = sandbox(SandboxSpec::new(ws.path()).file_size_limit(1 << 20));
    let out = sb
        .run(&Command::bash(
            "fallocate -l 30G big 2>&1; echo fallocate=$?; head -c 2M /dev/zero > f2; echo head=$?; \
             truncate -s 40G sparse 2>&1; echo truncate=$?",
        ))
        .unwrap();
    for line in out.stdout.lines().filter(|l| l.contains('=')) {
        assert!(!line.ends_with("=0"), "{line}: {out:?}");
    }
    for f in ["big", "f2", "sparse"] {
        let len = std::fs::metadata(ws.path().join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len <= 1 << 20, "{f} is {len} bytes");
    }
    // The default limit (4 GiB) stops a 30 GiB fallocate too, before any block is taken.
    let ws = workspace();
    let out = sandbox(SandboxSpec::new(ws.path())).run(&Command::bash("fallocate -l 30G big; echo $?")).unwrap();
    assert_ne!(out.stdout, "0\n", "{out:?}");
    assert!(std::fs::metadata(ws.path().join("big")).map(|m| m.len()).unwrap_or(0) == 0);
}

#[test]
fn writing_past_the_disk_limit_kills_the_command() {
    let ws = workspace();
    let sb = sandbox(SandboxSpec::new(ws.path()).disk_limit(32 << 20));
    // 1 GiB in 1 MiB files, each under the file-size limit.
    let out = sb
        .run(&Command::bash("for i in $(seq 1 1024); do head -c 1M /dev/zero > f$i || exit 9; done; echo finished"))
        .unwrap();
    assert_eq!(out.limit_hit, Some(Limit::Disk), "{out:?}");
    assert!(!out.stdout.contains("finished"));
    assert_eq!(out.exit_code, None);
    assert!(out.stderr.contains("frognano-sandbox: killed: wrote more than 33554432 bytes to disk"), "{}", out.stderr);
    let written = size_of(ws.path());
    assert!(written < 512 << 20, "{written} bytes written before the kill");
}

#[test]
fn the_private_tmp_is_bounded() {
    let ws = workspace();
    let sb = sandbox(SandboxSpec::new(ws.path()).tmp_size(8 << 20));
    let out = sb.run(&Command::bash("head -c 20M /dev/zero > /tmp/fill; echo $?; du -k /tmp/fill | cut -f1")).unwrap();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_ne!(lines.first(), Some(&"0"), "{out:?}");
    let kib: u64 = lines.get(1).and_then(|l| l.trim().parse().ok()).unwrap_or(u64::MAX);
    assert!(kib <= 8 << 10, "{kib} KiB in /tmp: {out:?}");
}

#[test]
fn defaults_are_on() {
    let spec = SandboxSpec::new("/");
    assert_eq!(spec.memory_limit, Some(frognano_sandbox::default_memory_limit()));
    assert!(spec.memory_limit.unwrap() <= frognano_sandbox::DEFAULT_MEMORY_LIMIT_MAX);
    assert_eq!(spec.file_size_limit, Some(frognano_sandbox::DEFAULT_FILE_SIZE_LIMIT));
    assert_eq!(spec.disk_limit, Some(frognano_sandbox::DEFAULT_DISK_LIMIT));
    assert_eq!(spec.tmp_size, Some(frognano_sandbox::DEFAULT_TMP_SIZE));
    let off = spec.memory_limit(0).file_size_limit(0).disk_limit(0).tmp_size(0);
    assert_eq!((off.memory_limit, off.file_size_limit, off.disk_limit, off.tmp_size), (None, None, None, None));
}
