//! The escapes an attack run found (issue 13) and the attacks that were already blocked, each
//! tried from inside the sandbox, with the host checked afterwards. These need bubblewrap
//! (`scripts/ci-setup.sh` installs it).

use frognano_sandbox::{Command, Output, Sandbox, SandboxSpec};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cgroup_setup;

/// A scratch folder outside `/tmp` (the sandbox's own `/tmp` would hide anything under the
/// host's, so escapes are tried against folders the sandbox does show, read-only).
fn host_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn spec(ws: &Path) -> SandboxSpec {
    SandboxSpec::new(ws).timeout(Duration::from_secs(20))
}

fn run(spec: SandboxSpec, script: &str) -> Output {
    Sandbox::new(spec)
        .expect("bubblewrap must work for these tests; run scripts/ci-setup.sh")
        .run(&Command::new("bash").arg("-c").arg(script))
        .unwrap()
}

/// `ws` inside a fresh host folder, with `host.txt` beside it.
fn ws_and_host_file() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = host_dir();
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let host = root.path().join("host.txt");
    std::fs::write(&host, "original\n").unwrap();
    (root, ws, host)
}

/// Python one-liner calling libc through ctypes; prints `ret errno`.
fn py_call(expr: &str) -> String {
    format!(
        "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); r = {expr}; print(r, ctypes.get_errno())'"
    )
}

#[test]
fn commands_run_without_capabilities_as_a_non_root_user() {
    let (_root, ws, _) = ws_and_host_file();
    let out = run(spec(&ws), "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; id -u");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{out:?}");
    for line in &lines[..4] {
        assert!(line.ends_with("0000000000000000"), "capabilities left inside: {line}");
    }
    assert_ne!(lines[4], "0", "runs as root inside");
}

#[test]
fn files_the_command_creates_belong_to_the_caller() {
    use std::os::unix::fs::MetadataExt;
    let (_root, ws, _) = ws_and_host_file();
    std::fs::write(ws.join("mine.txt"), "x").unwrap();
    let out = run(spec(&ws), "echo y >> mine.txt && mkdir d && echo z > d/new.txt && echo ok");
    assert_eq!(out.stdout, "ok\n", "{out:?}");
    // SAFETY: plain syscall.
    let uid = unsafe { libc::geteuid() };
    for f in ["mine.txt", "d", "d/new.txt"] {
        assert_eq!(std::fs::metadata(ws.join(f)).unwrap().uid(), uid, "{f}");
    }
    assert_eq!(std::fs::read_to_string(ws.join("mine.txt")).unwrap(), "xy\n");
}

#[test]
fn remounting_the_root_read_write_fails_and_the_host_is_untouched() {
    let (_root, ws, host) = ws_and_host_file();
    let script = format!(
        "mount -o remount,bind,rw / ; echo remount=$?; umount -l /tmp; echo umount=$?; \
         echo x > {h} ; echo write=$?; mount -t tmpfs none {w}; echo tmpfs=$?; {mnt}; {umnt}",
        h = host.display(),
        w = ws.display(),
        // The system calls themselves, past whatever checks mount(8) makes first.
        mnt = py_call("l.mount(b\"/\", b\"/\", None, ctypes.c_ulong(0x20 | 0x1000), None)"),
        umnt = py_call("l.umount2(b\"/tmp\", 2)"),
    );
    let out = run(spec(&ws), &script);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{out:?}");
    for line in &lines[..4] {
        assert!(!line.ends_with("=0"), "succeeded inside: {line}\n{out:?}");
    }
    assert_eq!(lines[4], format!("-1 {}", libc::EPERM), "mount(2)");
    assert_eq!(lines[5], format!("-1 {}", libc::EPERM), "umount2(2)");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "original\n");
}

#[test]
fn cgroup_files_are_out_of_reach() {
    let (_root, ws, _) = ws_and_host_file();
    let script = "ls -A /sys/fs/cgroup | wc -l; \
                  mount -o remount,rw /sys/fs/cgroup/pids 2>/dev/null; echo remount=$?; \
                  echo $$ > /sys/fs/cgroup/pids/cgroup.procs; echo procs=$?; \
                  echo $$ > /sys/fs/cgroup/cgroup.procs; echo procs2=$?; \
                  echo max > /sys/fs/cgroup/pids/pids.max; echo max=$?";
    let sb = Sandbox::new(spec(&ws).max_processes(64)).unwrap();
    let out = sb.run(&Command::new("bash").arg("-c").arg(script)).unwrap();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{out:?}");
    assert_eq!(lines[0], "0", "cgroupfs visible inside: {out:?}");
    for line in &lines[1..] {
        assert!(!line.ends_with("=0"), "succeeded inside: {line}\n{out:?}");
    }
    if sb.process_limit_enforced() {
        // Still under the cap: 100 sleeps in the background cannot all start.
        let out = sb.run(&Command::bash("for i in $(seq 100); do sleep 5 & done 2>&1 | sort -u | head -3")).unwrap();
        assert!(out.stdout.contains("Resource temporarily unavailable"), "{out:?}");
    } else {
        cgroup_setup::skip_without_cgroup("pids", "cgroup_files_are_out_of_reach");
    }
}

#[test]
fn new_namespaces_ptrace_and_kernel_keys_are_refused() {
    let (_root, ws, _) = ws_and_host_file();
    let clone_newuser = libc::CLONE_NEWUSER | libc::SIGCHLD;
    let script = [
        "unshare -U true 2>/dev/null; echo userns=$?".to_string(),
        "unshare -m true 2>/dev/null; echo mountns=$?".to_string(),
        "unshare -rn true 2>/dev/null; echo netns=$?".to_string(),
        py_call(&format!("l.syscall({}, {clone_newuser}, 0, 0, 0, 0)", libc::SYS_clone)),
        py_call(&format!("l.syscall({}, 0x10000000)", libc::SYS_unshare)),
        py_call(&format!("l.syscall({}, 0, 0, 0, 0)", libc::SYS_ptrace)),
        py_call(&format!("l.syscall({}, 0, -3, 0)", libc::SYS_keyctl)),
        py_call(&format!("l.syscall({}, 0, 0, 0)", libc::SYS_bpf)),
        // Plain threads and forks still work (clone3 falls back to clone).
        "python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread\",)); t.start(); t.join()'"
            .to_string(),
        "(echo forked) | cat".to_string(),
    ]
    .join("; ");
    let out = run(spec(&ws), &script);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let eperm = format!("-1 {}", libc::EPERM);
    assert_eq!(lines.len(), 10, "{out:?}");
    for line in &lines[..3] {
        assert!(!line.ends_with("=0"), "succeeded inside: {line}\n{out:?}");
    }
    for (what, line) in ["clone(CLONE_NEWUSER)", "unshare", "ptrace", "keyctl", "bpf"].iter().zip(&lines[3..8]) {
        assert_eq!(*line, eperm, "{what}: {out:?}");
    }
    assert_eq!(&lines[8..], ["thread", "forked"], "{out:?}");
}

#[test]
fn writes_to_the_root_and_above_the_workspace_fail() {
    let (root, ws, host) = ws_and_host_file();
    let out = run(
        spec(&ws),
        "touch /frognano-root-write; echo root=$?; echo bad > ../host.txt; echo up=$?; \
         echo new > ../new.txt; echo new=$?; cd .. && rm -f host.txt; echo rm=$?",
    );
    for line in out.stdout.lines() {
        assert!(!line.ends_with("=0"), "succeeded inside: {line}\n{out:?}");
    }
    assert!(!Path::new("/frognano-root-write").exists());
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "original\n");
    assert!(!root.path().join("new.txt").exists());
}

#[test]
fn a_hard_link_to_a_host_file_cannot_be_made_or_written() {
    let (_root, ws, host) = ws_and_host_file();
    let out = run(
        spec(&ws),
        &format!(
            "ln {h} link 2>&1; echo ln=$?; ln /etc/passwd link2 2>&1; echo ln2=$?; \
             echo bad >> link 2>/dev/null; echo write=$?",
            h = host.display()
        ),
    );
    assert!(out.stdout.contains("ln=1") && out.stdout.contains("ln2=1"), "{out:?}");
    assert!(out.stdout.contains("Invalid cross-device link"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "original\n");
    assert!(!ws.join("link2").exists());
    // A plain file of that name was created in the workspace, nothing more.
    assert_eq!(std::fs::read_to_string(ws.join("link")).unwrap(), "bad\n");
}

#[test]
fn a_loopback_listener_on_the_host_is_unreachable() {
    let (_root, ws, _) = ws_and_host_file();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = run(
        spec(&ws),
        &format!("(echo hello > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED || echo REFUSED"),
    );
    assert_eq!(out.stdout, "REFUSED\n", "{out:?}");
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host listener saw a connection: {accepted:?}"
    );
}

#[test]
fn a_double_forked_daemon_does_not_outlive_the_command() {
    let (_root, ws, _) = ws_and_host_file();
    let marker = format!("frognano-daemon-{}", std::process::id());
    let out = run(
        spec(&ws),
        &format!(
            "( ( setsid nohup bash -c 'exec -a {marker} sleep 300' >/dev/null 2>&1 & ) & ); \
             disown -a; echo started"
        ),
    );
    assert_eq!(out.stdout, "started\n", "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            assert!(!text.starts_with(&marker), "left running: {text}");
        }
    }
}

#[test]
fn with_the_network_allowed_commands_still_run_confined() {
    let (_root, ws, host) = ws_and_host_file();
    let out = run(
        spec(&ws).network(true),
        &format!(
            "cat /etc/resolv.conf > /dev/null && echo resolv; id -u; echo x > {} || echo read-only",
            host.display()
        ),
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:?}");
    assert!(Path::new("/etc/resolv.conf").exists() == (lines[0] == "resolv"), "{out:?}");
    assert_ne!(lines[1], "0");
    assert_eq!(lines[2], "read-only");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "original\n");
}
