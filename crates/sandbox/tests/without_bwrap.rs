//! Where bubblewrap cannot be found, confinement is refused with a message that says how to
//! fix it or opt out; an explicit unconfined sandbox still runs. (Own test binary, because it
//! changes PATH for the whole process.)

use frognano_sandbox::{Command, Isolation, Sandbox, SandboxError, SandboxSpec};

#[test]
fn without_bwrap_confinement_is_refused_and_opting_out_works() {
    std::env::set_var("PATH", "/nonexistent-frognano-path");
    let ws = tempfile::tempdir().unwrap();
    let err = Sandbox::new(SandboxSpec::new(ws.path())).unwrap_err();
    assert!(matches!(err, SandboxError::Unavailable { .. }));
    let text = err.to_string();
    assert!(text.contains("bwrap is not installed"), "{text}");
    assert!(text.contains("apt-get install bubblewrap"), "{text}");
    assert!(text.contains("--no-sandbox"), "{text}");
    assert!(Sandbox::bubblewrap_available().is_err());

    let sb = Sandbox::new(SandboxSpec::new(ws.path()).isolation(Isolation::Unconfined)).unwrap();
    let out = sb.run(&Command::new("/bin/echo").arg("ran")).unwrap();
    assert_eq!(out.stdout, "ran\n");
}
