//! Cgroups a killed FrogNano process left behind are removed at the next start; those of live
//! processes are kept. (Own test binary: the cleanup runs at the first `Sandbox::new` of a
//! process.)

use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};

use crate::cgroup_setup;

#[test]
fn stale_groups_of_dead_processes_are_removed_at_the_first_sandbox() {
    let roots = Sandbox::cgroup_roots();
    if roots.is_empty() {
        cgroup_setup::skip_without_cgroup("pids", "stale_groups_of_dead_processes_are_removed_at_the_first_sandbox");
        return;
    }
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let own = std::process::id();
    let mut stale = Vec::new();
    let mut live = Vec::new();
    for root in &roots {
        for name in [format!("frognano-sandbox-{dead}-3"), format!("frognano-probe-{dead}")] {
            std::fs::create_dir(root.join(&name)).unwrap();
            stale.push(root.join(name));
        }
        for name in [format!("frognano-sandbox-{own}-999999"), "frognano-sandbox-1-5".to_string()] {
            std::fs::create_dir(root.join(&name)).unwrap();
            live.push(root.join(name));
        }
    }
    let ws = tempfile::tempdir().unwrap();
    Sandbox::new(SandboxSpec::new(ws.path()).isolation(Isolation::Unconfined)).unwrap();
    let left: Vec<_> = stale.iter().filter(|p| p.exists()).collect();
    let kept = live.iter().all(|p| p.exists());
    for p in &live {
        let _ = std::fs::remove_dir(p);
    }
    assert!(left.is_empty(), "not removed: {left:?}");
    assert!(kept, "a live process's group was removed");
}
