//! `frognano solve --replay` against a hostile or clumsy model: whatever the agent did to its
//! workspace, `solve` writes all three outputs (`patch.diff`, `trajectory.json`,
//! `summary.md`), the patch is exact bytes, and nothing outside the workspace changes.
//! Each test replays a trajectory of Bash calls, the way a model would issue them.

use frognano_agent::demo;
use frognano_agent::solve::{solve, ModelChoice, SolveConfig};
use frognano_agent::trajectory::{ExitReason, Trajectory};
use frognano_testkit::git;
use std::path::{Path, PathBuf};

/// Writes a trajectory whose assistant turns run `commands` with Bash, then finish.
fn replay_of(dir: &Path, commands: &[&str]) -> PathBuf {
    let template = Trajectory::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/fix-median.trajectory.json"))
        .expect("the demo trajectory loads");
    let mut value = serde_json::to_value(&template).unwrap();
    let mut messages = vec![value["messages"][0].clone(), value["messages"][1].clone()];
    for (i, command) in commands.iter().enumerate() {
        messages.push(serde_json::json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                "function": {"name": "Bash", "arguments": serde_json::json!({"command": command}).to_string()}}]
        }));
    }
    messages.push(serde_json::json!({"role": "assistant", "content": "Done."}));
    value["messages"] = serde_json::Value::Array(messages);
    let path = dir.join("replay.json");
    std::fs::write(&path, value.to_string()).unwrap();
    path
}

struct Run {
    _root: tempfile::TempDir,
    repo: PathBuf,
    output: PathBuf,
    trajectory: Trajectory,
}

fn run(commands: &[&str]) -> Run {
    let root = tempfile::tempdir().unwrap();
    let repo = demo::materialize(&root.path().join("user-repo")).unwrap();
    let output = root.path().join("out");
    let args = SolveConfig {
        model: ModelChoice::Replay(replay_of(root.path(), commands)),
        output: Some(output.clone()),
        ..SolveConfig::for_repo(&repo)
    };
    let report = solve(&args).expect("solve finishes whatever the agent did");
    Run { _root: root, repo, output, trajectory: report.trajectory }
}

/// Applies `patch.diff` of `run` to a fresh clone of the user's repository.
fn apply_to_fresh_clone(run: &Run) -> PathBuf {
    let fresh = run._root.path().join("fresh");
    // testkit's git fails the test with git's own message when a step fails.
    git(run._root.path(), &["clone", "-q", run.repo.to_str().unwrap(), fresh.to_str().unwrap()]);
    git(&fresh, &["apply", "--binary", run.output.join("patch.diff").to_str().unwrap()]);
    fresh
}

#[test]
fn a_300_mb_file_is_left_out_and_the_rest_of_the_patch_kept() {
    let r = run(&["truncate -s 300M big.bin && printf '\\x00\\x01\\x02binary' > small.bin && \
         sed -i 's/return ordered\\[middle\\]/return (ordered[middle - 1] + ordered[middle]) \\/ 2/' stats.py"]);
    assert_eq!(r.trajectory.exit_reason, ExitReason::Agent);
    let saved = Trajectory::load(&r.output.join("trajectory.json")).unwrap();
    assert_eq!(saved.exit_reason, ExitReason::Agent, "the saved trajectory's exit reason is final");
    assert!(!saved.partial);
    let patch = std::fs::read(r.output.join("patch.diff")).unwrap();
    let text = String::from_utf8_lossy(&patch);
    assert!(text.contains("diff --git a/stats.py b/stats.py"), "{text}");
    assert!(text.contains("diff --git a/small.bin b/small.bin") && text.contains("GIT binary patch"), "{text}");
    assert!(!text.contains("big.bin"), "the 300 MB file is not in the patch");
    assert!(patch.len() < 1 << 20);
    let summary = std::fs::read_to_string(r.output.join("summary.md")).unwrap();
    assert!(summary.contains("- small.bin (binary)"), "{summary}");
    assert!(summary.contains("## Left out of the patch (1)"), "{summary}");
    assert!(summary.contains("- big.bin (300.0 MiB): larger than the 8.0 MiB per-file limit"), "{summary}");
    let fresh = apply_to_fresh_clone(&r);
    assert_eq!(std::fs::read(fresh.join("small.bin")).unwrap(), b"\x00\x01\x02binary");
    assert!(!fresh.join("big.bin").exists());
}

#[test]
fn non_utf8_contents_and_file_names_survive_byte_for_byte() {
    let r = run(&[
        "printf 'caf\\xe9\\n' > latin1.txt && printf 'x\\n' > $'\\xff\\xfe.txt' && printf 'na\\xefve\\n' >> stats.py",
    ]);
    let patch = std::fs::read(r.output.join("patch.diff")).unwrap();
    assert!(patch.windows(4).any(|w| w == b"caf\xe9"), "the patch keeps the raw byte");
    assert!(!patch.windows(3).any(|w| w == "\u{fffd}".as_bytes()), "no replacement characters");
    let fresh = apply_to_fresh_clone(&r);
    assert_eq!(std::fs::read(fresh.join("latin1.txt")).unwrap(), b"caf\xe9\n");
    use std::os::unix::ffi::OsStrExt;
    assert_eq!(std::fs::read(fresh.join(std::ffi::OsStr::from_bytes(b"\xff\xfe.txt"))).unwrap(), b"x\n");
    assert!(std::fs::read(fresh.join("stats.py")).unwrap().ends_with(b"na\xefve\n"));
}

#[test]
fn a_broken_workspace_still_gets_all_three_outputs() {
    let r = run(&["echo change >> stats.py && rm -rf .git"]);
    assert_eq!(r.trajectory.exit_reason, ExitReason::Agent);
    let saved = Trajectory::load(&r.output.join("trajectory.json")).unwrap();
    assert_eq!(saved.exit_reason, ExitReason::Agent);
    assert!(saved.error.as_deref().unwrap_or("").contains("cannot compute the workspace diff"), "{:?}", saved.error);
    assert_eq!(std::fs::read(r.output.join("patch.diff")).unwrap(), b"");
    let summary = std::fs::read_to_string(r.output.join("summary.md")).unwrap();
    assert!(summary.contains("## No patch") && summary.contains("cannot compute the workspace diff"), "{summary}");
    assert_eq!(git(&r.repo, &["status", "--porcelain"]), "");
}

#[test]
fn git_filters_and_hooks_planted_by_the_agent_never_run_on_the_host() {
    let marker = std::env::temp_dir().join(format!("frognano-filter-ran-{}", std::process::id()));
    let m = marker.display();
    let plant = format!(
        "git config filter.evil.clean 'touch {m}; cat' && git config diff.evil.textconv 'touch {m}; cat' && \
         git config core.fsmonitor 'touch {m}; true' && printf '* filter=evil diff=evil\\n' > .gitattributes && \
         printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && \
         echo change >> stats.py"
    );
    let r = run(&[&plant]);
    assert!(!marker.exists(), "a filter, textconv, fsmonitor or hook ran on the host");
    let patch = std::fs::read_to_string(r.output.join("patch.diff")).unwrap();
    assert!(patch.contains("+change"), "{patch}");
    let _ = std::fs::remove_file(&marker);
}

#[test]
fn a_hostile_model_cannot_touch_the_users_repository_or_the_host() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let host_file = root.path().join("host-file.txt");
    let secret_var = format!("FROGNANO_SOLVE_SECRET_{}", std::process::id());
    std::env::set_var(&secret_var, "hunter2");
    let repo = demo::materialize(&root.path().join("user-repo")).unwrap();
    let h = host_file.display();
    let rp = repo.display();
    let attacks = [
        // Remount the read-only root writable, drop the private /tmp, then write the host.
        format!("mount -o remount,bind,rw / ; umount -l /tmp ; echo x > {h} ; echo y >> {rp}/README.md ; echo y >> {rp}/stats.py"),
        // New namespaces with fresh capabilities.
        format!("unshare -rm sh -c 'mount -o remount,rw / && echo x > {h}'"),
        // The cgroup that caps processes, and the host's environment.
        "echo $$ > /sys/fs/cgroup/pids/cgroup.procs ; printenv > env.txt".to_string(),
        // A legitimate change, so the patch is not empty.
        "echo '# reviewed' >> stats.py".to_string(),
    ];
    let commands: Vec<&str> = attacks.iter().map(String::as_str).collect();
    let output = root.path().join("out");
    let args = SolveConfig {
        model: ModelChoice::Replay(replay_of(root.path(), &commands)),
        output: Some(output.clone()),
        ..SolveConfig::for_repo(&repo)
    };
    let report = solve(&args).unwrap();
    assert_eq!(report.trajectory.exit_reason, ExitReason::Agent);
    assert!(!host_file.exists(), "a sandboxed command wrote a host file");
    assert_eq!(git(&repo, &["status", "--porcelain"]), "", "the user's repository changed");
    let patch = std::fs::read_to_string(output.join("patch.diff")).unwrap();
    assert!(patch.contains("+# reviewed"), "{patch}");
    assert!(!patch.contains("hunter2"), "the host environment reached the sandbox");
    assert!(patch.contains("+PATH="), "env.txt is in the patch: {patch}");
    assert!(!patch.contains("README.md"));
}

/// `frognano solve --continue-from RUN --comment TEXT`: the model is asked with the whole old
/// conversation and the comment after it, in a workspace at the old base commit that holds
/// the old patch (even though the repository has a new commit since and a dirty tree), and the
/// new run records its parent and numbers its steps after the old ones.
#[test]
fn a_run_continues_from_its_trajectory_with_the_comment_as_the_next_user_message() {
    use frognano_agent::replay::ReplayLlm;
    use frognano_agent::run_dir::RunInfo;
    use frognano_agent::solve::{solve_with_llm, TaskInput};
    use std::sync::atomic::AtomicBool;
    let first = run(&["echo '# first change' >> stats.py"]);
    let old = Trajectory::load(&first.output.join("trajectory.json")).unwrap();
    let old_info = RunInfo::load(&first.output).unwrap();
    assert_eq!(old_info.repo, first.repo.canonicalize().unwrap());
    // The repository moves on and its tree is dirty: the continuation does not care.
    std::fs::write(first.repo.join("later.txt"), "later\n").unwrap();
    frognano_testkit::commit(&first.repo, "a later commit");
    std::fs::write(first.repo.join("README.md"), "dirty\n").unwrap();

    let script = replay_of(first._root.path(), &["cat stats.py | tail -1 && echo '# second change' >> stats.py"]);
    let llm = ReplayLlm::new(&Trajectory::load(&script).unwrap(), "script");
    let output = first._root.path().join("continued");
    let comment = "Also add a second change.";
    let args = SolveConfig {
        task: TaskInput::Continue { run: first.output.clone(), comment: comment.into() },
        model: ModelChoice::InProcess(Some("scripted".into())),
        output: Some(output.clone()),
        ..SolveConfig::for_repo("/nonexistent: the repository comes from run.json")
    };
    let report = solve_with_llm(&args, Box::new(llm), &AtomicBool::new(false), &mut |_| {}).unwrap();
    let t = report.trajectory;
    assert_eq!(&t.messages[..old.messages.len()], &old.messages[..], "the old conversation comes first");
    assert_eq!(
        (t.messages[old.messages.len()].role.as_str(), &*t.messages[old.messages.len()].text()),
        ("user", comment)
    );
    assert_eq!(t.steps.len(), old.steps.len() + 2);
    assert_eq!(t.steps[old.steps.len()].step, old.steps.len(), "new steps are numbered after the old ones");
    let seen = &t.steps[old.steps.len()].observations[0].observation;
    assert!(seen.contains("# first change"), "the workspace holds the old patch: {seen}");
    let patch = std::fs::read_to_string(output.join("patch.diff")).unwrap();
    assert!(patch.contains("+# first change") && patch.contains("+# second change"), "{patch}");
    assert!(!patch.contains("later.txt"), "the workspace is at the old base commit: {patch}");
    let info = RunInfo::load(&output).unwrap();
    assert_eq!(info.base_commit, old_info.base_commit);
    let parent = info.parent.expect("the parent is recorded");
    assert_eq!(
        (parent.dir, parent.steps, parent.comment.as_str()),
        (first.output.canonicalize().unwrap(), old.steps.len(), comment)
    );
    let summary = std::fs::read_to_string(output.join("summary.md")).unwrap();
    assert!(summary.contains("- continues: "), "{summary}");

    // A run still going, and an empty comment, are refused before anything runs.
    let mut partial = old.clone();
    partial.partial = true;
    partial.save(&first.output.join("trajectory.json")).unwrap();
    let again = SolveConfig { output: Some(first._root.path().join("never")), ..args.clone() };
    let err = frognano_agent::solve::solve(&again).unwrap_err().to_string();
    assert!(err.contains("the run is still going"), "{err}");
    let empty = SolveConfig { task: TaskInput::Continue { run: first.output.clone(), comment: " ".into() }, ..again };
    assert!(empty.validate().unwrap_err().to_string().contains("--comment is empty"));
}
