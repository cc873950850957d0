//! Secrets on the host stay out of reach: system files holding password hashes or keys, and
//! the user's home, where only toolchains stay visible. Also: a workspace and the caller's
//! paths stay visible wherever they are, `/tmp` and masked homes included.

use frognano_sandbox::{Command, Output, Sandbox, SandboxSpec};
use std::path::Path;
use std::time::Duration;

fn run(spec: SandboxSpec, script: &str) -> Output {
    Sandbox::new(spec.timeout(Duration::from_secs(20)))
        .expect("bubblewrap must work for these tests; run scripts/ci-setup.sh")
        .run(&Command::new("bash").arg("-c").arg(script))
        .unwrap()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn system_secret_files_cannot_be_read() {
    let ws = tempfile::tempdir().unwrap();
    let out = run(
        SandboxSpec::new(ws.path()),
        "for f in /etc/shadow /etc/gshadow /etc/sudoers /root/.npmrc /root/.ssh/id_rsa /root/.bash_history; do \
           if cat $f >/dev/null 2>&1; then echo \"READ $f\"; fi; done; \
         ls -A /run /var/run 2>/dev/null | grep -v '^/' | grep . ; echo done",
    );
    assert_eq!(out.stdout, "done\n", "{out:?}");
}

/// A fake home outside /tmp, as the user's home would be.
fn fake_home() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = root.path().join("home");
    write(&home.join(".ssh/id_ed25519"), "PRIVATE KEY\n");
    write(&home.join(".npmrc"), "//registry.npmjs.org/:_authToken=npm-token\n");
    write(&home.join(".aws/credentials"), "aws-secret\n");
    write(&home.join("notes.txt"), "personal notes\n");
    write(&home.join(".cargo/credentials.toml"), "cargo-token\n");
    write(&home.join(".cargo/bin/mytool"), "#!/bin/sh\necho tool-ok\n");
    write(&home.join(".rustup/settings.toml"), "toolchain-settings\n");
    write(&home.join("bin/other"), "#!/bin/sh\necho other-ok\n");
    write(&home.join(".local/share/pnpm/pnpm-tool"), "#!/bin/sh\necho pnpm-ok\n");
    write(&home.join(".local/share/other-app/private.txt"), "private\n");
    use std::os::unix::fs::PermissionsExt;
    for tool in [".cargo/bin/mytool", "bin/other", ".local/share/pnpm/pnpm-tool"] {
        std::fs::set_permissions(home.join(tool), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (root, home)
}

#[test]
fn the_home_is_masked_but_its_toolchains_and_a_workspace_inside_it_stay() {
    let (_root, home) = fake_home();
    let ws = home.join("src/project");
    write(&ws.join("README.md"), "project\n");
    let h = home.display();
    let listener = std::os::unix::net::UnixListener::bind(home.join("agent.sock")).unwrap();
    listener.set_nonblocking(true).unwrap();
    let path = format!("{h}/.cargo/bin:{h}/bin:{h}/.local/share/pnpm:/usr/local/bin:/usr/bin:/bin");
    let script = format!(
        "for f in {h}/.ssh/id_ed25519 {h}/.npmrc {h}/.aws/credentials {h}/notes.txt {h}/.cargo/credentials.toml \
                  {h}/.local/share/other-app/private.txt; do \
           if cat $f >/dev/null 2>&1; then echo \"READ $f\"; fi; done; \
         python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{h}/agent.sock\")' 2>/dev/null \
           && echo CONNECTED; \
         mytool; other; pnpm-tool; cat {h}/.rustup/settings.toml; \
         echo changed >> README.md && cat README.md; touch {h}/.cargo/new 2>/dev/null && echo WROTE-TOOLCHAIN; \
         ls -A {h} | tr '\\n' ' '; echo"
    );
    let spec = SandboxSpec::new(&ws).masked_homes([&home]).env("PATH", path);
    let out = run(spec, &script);
    assert_eq!(
        out.stdout,
        "tool-ok\nother-ok\npnpm-ok\ntoolchain-settings\nproject\nchanged\n.cargo .local .rustup bin src \n",
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(ws.join("README.md")).unwrap(), "project\nchanged\n");
    assert!(listener.accept().is_err(), "a socket in the home was reached");
}

#[test]
fn secrets_stay_masked_when_the_workspace_is_the_home_itself() {
    let (_root, home) = fake_home();
    let h = home.display();
    let out = run(
        SandboxSpec::new(&home).masked_homes([&home]),
        &format!(
            "for f in {h}/.ssh/id_ed25519 {h}/.npmrc {h}/.aws/credentials {h}/.cargo/credentials.toml; do \
               if cat $f >/dev/null 2>&1; then echo \"READ $f\"; fi; done; cat notes.txt; echo more >> notes.txt"
        ),
    );
    assert_eq!(out.stdout, "personal notes\n", "{out:?}");
    assert_eq!(std::fs::read_to_string(home.join("notes.txt")).unwrap(), "personal notes\nmore\n");
}

#[test]
fn toolchains_on_the_path_still_run() {
    let ws = tempfile::tempdir().unwrap();
    let sb = Sandbox::new(SandboxSpec::new(ws.path())).unwrap();
    let out = sb.run(&Command::new("python3").arg("--version")).unwrap();
    assert!(out.success() && out.stdout.starts_with("Python 3"), "{out:?}");
    // cargo (this test's own toolchain; through rustup's proxy where rustup is used).
    let host = std::process::Command::new("cargo").arg("--version").output();
    if host.is_ok_and(|o| o.status.success()) {
        let out = sb.run(&Command::new("cargo").arg("--version")).unwrap();
        assert!(out.success() && out.stdout.starts_with("cargo "), "{out:?}");
    }
}

#[test]
fn a_workspace_and_the_callers_paths_under_tmp_stay_visible() {
    // All under the host's /tmp, which the sandbox replaces by its own.
    let ws = tempfile::tempdir_in("/tmp").unwrap();
    let cache = tempfile::tempdir_in("/tmp").unwrap();
    let venv = tempfile::tempdir_in("/tmp").unwrap();
    let hidden = tempfile::tempdir_in("/tmp").unwrap();
    write(&venv.path().join("bin/tool"), "venv-tool\n");
    write(&hidden.path().join("other.txt"), "other\n");
    let spec = SandboxSpec::new(ws.path()).writable_path(cache.path()).readable_path(venv.path());
    let out = run(
        spec,
        &format!(
            "echo ws > {w}/a.txt && echo cache > {c}/b.txt && cat {v}/bin/tool && echo ok; \
             echo bad > {v}/bin/tool 2>/dev/null && echo WROTE-READABLE; \
             cat {o}/other.txt 2>/dev/null && echo SAW-HOST-TMP; echo private > /tmp/private.txt && echo tmp-ok",
            w = ws.path().display(),
            c = cache.path().display(),
            v = venv.path().display(),
            o = hidden.path().display()
        ),
    );
    assert_eq!(out.stdout, "venv-tool\nok\ntmp-ok\n", "{out:?}");
    assert_eq!(std::fs::read_to_string(ws.path().join("a.txt")).unwrap(), "ws\n");
    assert_eq!(std::fs::read_to_string(cache.path().join("b.txt")).unwrap(), "cache\n");
    assert_eq!(std::fs::read_to_string(venv.path().join("bin/tool")).unwrap(), "venv-tool\n");
    assert!(!Path::new("/tmp/private.txt").exists());
}

#[test]
fn hides_says_what_a_command_cannot_see() {
    let (_root, home) = fake_home();
    let ws = home.join("src/project");
    write(&ws.join("README.md"), "project\n");
    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    let path = format!("{}/.cargo/bin:/usr/bin:/bin", home.display());
    let sb =
        Sandbox::new(SandboxSpec::new(&ws).masked_homes([&home]).env("PATH", path).readable_path(tmp.path())).unwrap();
    for hidden in [".ssh/id_ed25519", ".npmrc", "notes.txt", ".cargo/credentials.toml", "agent.sock"] {
        assert!(sb.hides(&home.join(hidden)), "{hidden} shown");
    }
    for shown in [".cargo/bin/mytool", ".rustup/settings.toml", "src/project/README.md"] {
        assert!(!sb.hides(&home.join(shown)), "{shown} hidden");
    }
    assert!(sb.hides(Path::new("/etc/shadow")) || !Path::new("/etc/shadow").exists());
    assert!(sb.hides(Path::new("/tmp/some-other-file")));
    assert!(!sb.hides(&tmp.path().join("x")));
    assert!(!sb.hides(Path::new("/usr/bin/env")));
    let unconfined = Sandbox::new(SandboxSpec::new(&ws).isolation(frognano_sandbox::Isolation::Unconfined)).unwrap();
    assert!(!unconfined.hides(&home.join(".ssh/id_ed25519")));
}
