//! Scratch folders for workspaces, and the cleanup of those a killed run left behind.
//!
//! Every workspace FrogNano makes for untrusted code (the agent's clone, an evaluation or
//! training instance, a synthesis validation) lives in a folder named
//! `frognano-<label>-<pid>-<random>` holding a marker file. A run that is killed (SIGKILL, a
//! crash, a power cut) cannot remove its folders; the next run under the same root removes
//! every marked folder whose owning process is gone ([`remove_stale`]).

use std::io;
use std::path::{Path, PathBuf};

/// The file that marks a folder as ours (only marked folders are ever removed).
pub const MARKER: &str = ".frognano-scratch";

/// Creates a marked scratch folder under `root` (created if missing), removed when the
/// returned handle drops. `label` says what it is for (an instance id, `solve`...). The first
/// call for a root in this process first removes that root's stale folders ([`remove_stale`]).
pub fn scratch_dir(root: &Path, label: &str) -> io::Result<tempfile::TempDir> {
    std::fs::create_dir_all(root)?;
    static CLEANED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let key = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let first = {
        let mut cleaned = CLEANED.lock().unwrap_or_else(|e| e.into_inner());
        let first = !cleaned.contains(&key);
        if first {
            cleaned.push(key);
        }
        first
    };
    if first {
        let _ = remove_stale(root);
    }
    let label: String =
        label.chars().map(|c| if c.is_ascii_alphanumeric() || "._".contains(c) { c } else { '_' }).take(80).collect();
    let dir = tempfile::Builder::new().prefix(&format!("frognano-{label}-{}-", std::process::id())).tempdir_in(root)?;
    std::fs::write(dir.path().join(MARKER), b"")?;
    Ok(dir)
}

/// Removes the marked scratch folders under `root` whose owning process is no longer
/// alive, and returns them. Folders of live processes (this one and concurrent runs) and
/// anything unmarked are left alone. A missing `root` is not an error.
pub fn remove_stale(root: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = owner_pid(&name.to_string_lossy()) else { continue };
        let path = entry.path();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let marked = std::fs::symlink_metadata(path.join(MARKER)).map(|m| m.is_file()).unwrap_or(false);
        if !is_dir || !marked || crate::process_alive(pid) {
            continue;
        }
        make_removable(&path);
        if std::fs::remove_dir_all(&path).is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// The pid in `frognano-<label>-<pid>-<random>`.
fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("frognano-")?;
    let mut parts = rest.rsplitn(3, '-');
    let _random = parts.next()?;
    let pid = parts.next()?.parse::<i32>().ok()?;
    parts.next()?;
    (pid > 0).then_some(pid)
}

/// Gives the owner write and search permission on every folder below `dir` (without
/// following symlinks), so a tree whose folders the agent made read-only can be removed.
fn make_removable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                make_removable(&entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_owner_pid() {
        assert_eq!(owner_pid("frognano-solve-1234-AbC9x1"), Some(1234));
        assert_eq!(owner_pid("frognano-django__django-11099-77-xyz"), Some(77));
        assert_eq!(owner_pid("frognano-1234-x"), None);
        assert_eq!(owner_pid("other-solve-1234-x"), None);
    }

    #[test]
    fn stale_folders_go_and_live_or_unmarked_ones_stay() {
        let root = tempfile::tempdir().unwrap();
        let live = scratch_dir(root.path(), "live").unwrap();
        // A pid that cannot be alive: above the kernel's pid_max limit (4194304).
        let dead = root.path().join("frognano-inst_1-99999999-abc");
        std::fs::create_dir_all(dead.join("repo/locked/deeper")).unwrap();
        std::fs::write(dead.join(MARKER), b"").unwrap();
        std::fs::write(dead.join("repo/locked/deeper/f"), b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dead.join("repo/locked"), std::fs::Permissions::from_mode(0o500)).unwrap();
        let unmarked = root.path().join("frognano-user-99999999-abc");
        std::fs::create_dir(&unmarked).unwrap();
        let removed = remove_stale(root.path()).unwrap();
        assert_eq!(removed, vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(live.path().join(MARKER).is_file());
        assert!(unmarked.is_dir());
        assert_eq!(remove_stale(&root.path().join("missing")).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn the_first_scratch_folder_under_a_root_clears_what_a_killed_run_left() {
        let root = tempfile::tempdir().unwrap();
        let dead = root.path().join("frognano-django__django_11099-99999999-abc");
        std::fs::create_dir_all(dead.join("repo")).unwrap();
        std::fs::write(dead.join(MARKER), b"").unwrap();
        let fresh = scratch_dir(root.path(), "django__django-11099").unwrap();
        assert!(!dead.exists(), "the killed run's workspace is gone");
        let name = fresh.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(&format!("frognano-django__django_11099-{}-", std::process::id())), "{name}");
    }
}
