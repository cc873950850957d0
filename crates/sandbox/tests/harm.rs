//! Commands that try to do harm, and the proof that they could not. These need bubblewrap
//! (`scripts/ci-setup.sh` installs it).

use frognano_sandbox::{Command, Isolation, Limit, Sandbox, SandboxError, SandboxSpec};

use crate::cgroup_setup;
use std::path::Path;
use std::time::Duration;

fn sandbox(ws: &Path) -> Sandbox {
    Sandbox::new(SandboxSpec::new(ws).timeout(Duration::from_secs(20)))
        .expect("bubblewrap must work for these tests; run scripts/ci-setup.sh")
}

/// Processes on the host whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) && !text.contains("cargo") {
                found.push(format!("{}: {}", entry.file_name().to_string_lossy(), text));
            }
        }
    }
    found
}

#[test]
fn runs_a_command_and_reports_exit_code_and_both_streams() {
    let ws = tempfile::tempdir().unwrap();
    let out = sandbox(ws.path()).run(&Command::bash("echo out; echo err >&2; exit 3")).unwrap();
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");
    assert!(!out.timed_out && !out.truncated);
}

#[test]
fn writes_land_in_the_workspace_and_nowhere_else() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let outside = root.path().join("outside.txt");
    let script = format!(
        "echo inside > inside.txt; echo bad > {o}; echo bad > /etc/frognano-harm; \
         echo private > /tmp/frognano-private-tmp; ls /tmp",
        o = outside.display()
    );
    let out = sandbox(&ws).run(&Command::bash(script)).unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("inside.txt")).unwrap(), "inside\n");
    assert!(!outside.exists(), "wrote outside the workspace");
    assert!(!Path::new("/etc/frognano-harm").exists());
    assert!(out.stderr.contains("Read-only file system"), "{}", out.stderr);
    // The sandbox's /tmp is its own: empty at start, gone afterwards.
    assert!(!Path::new("/tmp/frognano-private-tmp").exists());
}

#[test]
fn the_network_is_unreachable() {
    let ws = tempfile::tempdir().unwrap();
    let out = sandbox(ws.path())
        .run(&Command::bash(
            "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; \
             (echo > /dev/tcp/1.1.1.1/80) 2>/dev/null && echo CONNECTED || echo NO-ROUTE",
        ))
        .unwrap();
    assert_eq!(out.stdout, "lo\nNO-ROUTE\n", "stderr: {}", out.stderr);
}

#[test]
fn background_processes_do_not_outlive_the_command() {
    let ws = tempfile::tempdir().unwrap();
    let marker = format!("frognano-linger-{}", std::process::id());
    let script = format!(
        "(exec -a {m}-bg sleep 300) & setsid bash -c 'exec -a {m}-setsid sleep 300' & \
         nohup bash -c 'exec -a {m}-nohup sleep 300' >/dev/null 2>&1 & echo started",
        m = marker
    );
    let out = sandbox(ws.path()).run(&Command::bash(script)).unwrap();
    assert_eq!(out.stdout, "started\n");
    assert!(out.elapsed < Duration::from_secs(10), "waited for children");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[test]
fn a_command_past_its_time_limit_is_killed_with_its_children() {
    let ws = tempfile::tempdir().unwrap();
    let marker = format!("frognano-slow-{}", std::process::id());
    let out = sandbox(ws.path())
        .run(
            &Command::bash(format!("echo before; (exec -a {marker} sleep 300) & sleep 300"))
                .timeout(Duration::from_millis(700)),
        )
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None);
    assert_eq!(out.stdout, "before\n", "keeps what was printed before the kill");
    assert!(out.elapsed < Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

#[test]
fn an_output_flood_is_capped_and_stopped() {
    let ws = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(
        SandboxSpec::new(ws.path()).output_limit(1000).flood_limit(4 << 20).timeout(Duration::from_secs(60)),
    )
    .unwrap();
    let out = sb.run(&Command::bash("yes flood; echo never")).unwrap();
    assert!(out.truncated && out.flooded);
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout.starts_with("flood\nflood\n"));
    assert!(!out.timed_out, "stopped for flooding, not by the clock");
    assert!(out.elapsed < Duration::from_secs(30));
}

#[test]
fn small_overflow_is_truncated_but_the_command_finishes() {
    let ws = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(SandboxSpec::new(ws.path()).output_limit(10)).unwrap();
    let out = sb.run(&Command::bash("seq 1 100; exit 0")).unwrap();
    assert_eq!(out.exit_code, Some(0));
    assert!(out.truncated && !out.flooded);
    assert_eq!(out.stdout, "1\n2\n3\n4\n5\n");
}

#[test]
fn a_fork_bomb_is_contained_and_cleaned_up() {
    let ws = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(SandboxSpec::new(ws.path()).max_processes(64).timeout(Duration::from_secs(3))).unwrap();
    let marker = format!("frognano-bomb-{}", std::process::id());
    // Without a pids cgroup nothing would bound a real fork bomb, so there we run one that
    // stops itself at depth 7 (at most 255 processes): it still proves the tree is killed.
    let script = if sb.process_limit_enforced() {
        // The first shell stays until the clock ends it, so the bomb cannot finish (and be
        // cleaned up) before it reaches the limit, however slowly a loaded machine lets it grow.
        format!("exec -a {marker} bash -c 'b() {{ b | b & }}; b; sleep 300'")
    } else {
        format!(
            "exec -a {marker} bash -c 'b() {{ [ $1 -lt 7 ] && {{ b $(($1+1)) & b $(($1+1)) & }}; sleep 300; }}; b 0'"
        )
    };
    let out = sb.run(&Command::bash(script)).unwrap();
    if sb.process_limit_enforced() {
        // Evidence the limit held, read from the cgroup's pids.events before it was removed:
        // forks were refused; then the clock ended the bomb.
        assert_eq!(out.limit_hit, Some(Limit::Processes), "{out:?}");
        assert!(out.timed_out, "{out:?}");
        assert!(out.stderr.contains("fork(s) refused: the sandbox's process limit is 64 processes"), "{out:?}");
    } else {
        cgroup_setup::skip_without_cgroup("pids", "a_fork_bomb_is_contained_and_cleaned_up");
        assert!(out.timed_out, "{out:?}");
    }
    assert!(out.elapsed < Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    // The host can still start processes.
    assert!(std::process::Command::new("true").status().unwrap().success());
}

#[test]
fn a_process_limit_the_cgroup_refuses_is_an_error_not_a_run_without_it() {
    let ws = tempfile::tempdir().unwrap();
    // pids.max takes at most the kernel's pid limit (2^22): the write fails with EINVAL.
    let sb = Sandbox::new(SandboxSpec::new(ws.path()).max_processes(u32::MAX)).unwrap();
    if !sb.process_limit_enforced() {
        cgroup_setup::skip_without_cgroup(
            "pids",
            "a_process_limit_the_cgroup_refuses_is_an_error_not_a_run_without_it",
        );
        return;
    }
    let err = sb.run(&Command::new("echo").arg("ran")).unwrap_err();
    assert!(matches!(err, SandboxError::Cgroup { what: "process", .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("cannot set the sandbox's process limit in cgroup") && text.contains("pids.max"), "{text}");
    // Nothing is left behind, and a sandbox with a valid limit still runs.
    let ok = Sandbox::new(SandboxSpec::new(ws.path()).max_processes(64)).unwrap();
    assert_eq!(ok.run(&Command::new("echo").arg("ran")).unwrap().stdout, "ran\n");
}

#[test]
fn working_dir_must_stay_inside_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let sb = sandbox(ws.path());
    let out = sb.run(&Command::new("pwd").current_dir("sub")).unwrap();
    assert!(out.stdout.trim_end().ends_with("/sub"));
    let err = sb.run(&Command::new("pwd").current_dir("../..")).unwrap_err();
    assert!(err.to_string().contains("not a directory inside the workspace"));
}

#[test]
fn stdin_is_fed_and_closed() {
    let ws = tempfile::tempdir().unwrap();
    let out = sandbox(ws.path()).run(&Command::new("cat").stdin("hello")).unwrap();
    assert_eq!(out.stdout, "hello");
}

#[test]
fn a_missing_workspace_is_a_clear_error() {
    let err = Sandbox::new(SandboxSpec::new("/nonexistent/frognano-ws")).unwrap_err();
    assert_eq!(err.to_string(), "sandbox workspace /nonexistent/frognano-ws is not a directory");
}

#[test]
fn unconfined_runs_still_kill_the_tree_and_honour_the_clock() {
    let ws = tempfile::tempdir().unwrap();
    // Two seconds: with 500 ms, a CI machine busy with other test binaries once killed bash
    // before it had printed anything (stdout "").
    let sb = Sandbox::new(SandboxSpec::new(ws.path()).isolation(Isolation::Unconfined).timeout(Duration::from_secs(2)))
        .unwrap();
    assert!(!sb.is_confined());
    let marker = format!("frognano-unconfined-{}", std::process::id());
    let out = sb.run(&Command::bash(format!("(exec -a {marker} sleep 300) & echo hi; sleep 300"))).unwrap();
    assert!(out.timed_out);
    assert_eq!(out.stdout, "hi\n");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}
