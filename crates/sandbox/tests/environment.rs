//! Confined commands start from a clean environment: the host's variables stay outside
//! unless named. (Own test binary with one test: it sets a variable on this process.)

use frognano_sandbox::{Command, Isolation, Sandbox, SandboxSpec, PASSED_ENV};

#[test]
fn the_host_environment_stays_outside_unless_named() {
    let secret = format!("FROGNANO_TEST_SECRET_{}", std::process::id());
    let allowed = format!("FROGNANO_TEST_ALLOWED_{}", std::process::id());
    // Set before any thread of this binary spawns processes.
    std::env::set_var(&secret, "hunter2");
    std::env::set_var(&allowed, "shared-value");
    let ws = tempfile::tempdir().unwrap();

    let sb = Sandbox::new(SandboxSpec::new(ws.path()).env("FROM_SPEC", "spec-value")).unwrap();
    let out = sb.run(&Command::new("env").env("FROM_COMMAND", "command-value")).unwrap();
    assert!(out.success(), "{out:?}");
    assert!(!out.stdout.contains("hunter2"), "a host variable reached the command:\n{}", out.stdout);
    assert!(!out.stdout.contains("shared-value"), "{}", out.stdout);
    let names: Vec<&str> = out.stdout.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    assert!(out.stdout.lines().any(|l| l == "HOME=/tmp"), "{}", out.stdout);
    assert!(out.stdout.contains("FROM_SPEC=spec-value\n") && out.stdout.contains("FROM_COMMAND=command-value\n"));
    let toolchain = ["RUSTUP_HOME", "CARGO_HOME", "PYENV_ROOT", "NVM_DIR"];
    let extra = ["HOME", "FROM_SPEC", "FROM_COMMAND", "PWD", "SHLVL", "_"];
    for name in &names {
        assert!(
            PASSED_ENV.contains(name) || toolchain.contains(name) || extra.contains(name),
            "unexpected variable {name} inside:\n{}",
            out.stdout
        );
    }
    assert_eq!(
        std::env::var("PATH").ok(),
        out.stdout.lines().find_map(|l| l.strip_prefix("PATH=")).map(str::to_string),
        "PATH is passed as it is"
    );

    // Named with pass_env, it is passed; the other still is not.
    let sb = Sandbox::new(SandboxSpec::new(ws.path()).pass_env(&allowed)).unwrap();
    let out = sb.run(&Command::new("env")).unwrap();
    assert!(out.stdout.contains(&format!("{allowed}=shared-value\n")), "{}", out.stdout);
    assert!(!out.stdout.contains("hunter2"));

    // Unconfined commands keep the host environment, as before.
    let sb = Sandbox::new(SandboxSpec::new(ws.path()).isolation(Isolation::Unconfined)).unwrap();
    let out = sb.run(&Command::new("env")).unwrap();
    assert!(out.stdout.contains(&format!("{secret}=hunter2\n")), "{}", out.stdout);
}
