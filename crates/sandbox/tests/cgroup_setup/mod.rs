//! Whether this machine is one where the sandbox must find a writable cgroup, judged apart
//! from the sandbox's own probe, so that a broken probe cannot turn the limit tests into
//! skips unnoticed.

/// Why the `controller` ("pids", "memory") cgroup should be writable here: we are root and
/// it is a read-write v1 hierarchy, or a v2 hierarchy with the controller enabled for our
/// group's children. `None` where the setup gives no such promise (not root, a read-only or
/// missing cgroupfs, a v2 leaf group such as a systemd session scope).
pub fn writable_cgroup_expected(controller: &str) -> Option<String> {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, mnt, fstype, opts, ..] = f[..] else { continue };
        let opts: Vec<&str> = opts.split(',').collect();
        if !opts.contains(&"rw") {
            continue;
        }
        if fstype == "cgroup" && opts.contains(&controller) {
            return Some(format!("root with a read-write cgroup v1 {controller} hierarchy at {mnt}"));
        }
        if fstype == "cgroup2" {
            let Some(rel) = own.lines().find_map(|l| l.strip_prefix("0::")) else { continue };
            let dir = std::path::Path::new(mnt).join(rel.trim_start_matches('/'));
            let ctl = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            if ctl.split_whitespace().any(|c| c == controller) {
                return Some(format!(
                    "root in cgroup v2 group {} with {controller} enabled for children",
                    dir.display()
                ));
            }
        }
    }
    None
}

/// Where the sandbox found no writable `controller` cgroup: prints one visible
/// `SKIPPED (needs a writable cgroup)` line for `test`, or panics when
/// `FROGNANO_REQUIRE_FIXTURES` is set (CI) and [`writable_cgroup_expected`] says this machine
/// provides one, since then the sandbox's own detection is what broke.
pub fn skip_without_cgroup(controller: &str, test: &str) {
    let expected = writable_cgroup_expected(controller);
    if let (Some(why), Some(_)) = (&expected, std::env::var_os("FROGNANO_REQUIRE_FIXTURES")) {
        panic!("{test}: the sandbox found no writable {controller} cgroup, but this machine has one ({why})");
    }
    eprintln!(
        "SKIPPED (needs a writable cgroup): {test}: no writable {controller} cgroup here, the limit is not checked"
    );
}
