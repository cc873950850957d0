//! Harbor task directories for synthesized tasks (docs/grading.md §10): the issue
//! as `instruction.md`, the buggy commit as the environment, a verifier that runs the tests
//! and writes 1 to `/logs/verifier/reward.txt` iff the SWE-bench v5 resolution is FULL.

use std::path::Path;

use frognano_swe::SweInstance;

use crate::task_meta::SynthMeta;

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Writes `<root>/<instance_id>/` for `inst`; loadable by `frognano_swe::harbor`.
pub fn write_harbor_task(root: &Path, inst: &SweInstance) -> anyhow::Result<()> {
    let dir = root.join(&inst.instance_id);
    std::fs::create_dir_all(dir.join("environment"))?;
    std::fs::create_dir_all(dir.join("tests"))?;
    std::fs::write(dir.join("instruction.md"), &inst.problem_statement)?;
    let synth = SynthMeta::of(inst)?.unwrap_or_default();
    let d = &synth.difficulty;
    let ops: Vec<String> = synth.operators.iter().map(|o| toml_str(o)).collect();
    let parents: Vec<String> = synth.parents.iter().map(|p| toml_str(p)).collect();
    let toml = format!(
        "version = \"1.0\"\n\n[metadata]\nsource = \"frognano-synth\"\n\n[metadata.frognano]\nsource_repo = {}\nsource_commit = {}\n\
family = {}\noperators = [{}]\nseed = {}\nparents = [{}]\nnum_mutations = {}\nfiles = {}\nf2p_count = {}\n\
entity_complexity = {}\nreference_seconds = {}\nbug_seconds = {}\nissue_generator = {}\n\n\
[verifier]\ntimeout_sec = 1800.0\n\n[agent]\ntimeout_sec = 3600.0\n\n[environment]\nworkdir = \"/app\"\nallow_internet = false\n",
        toml_str(&synth.source_repo),
        toml_str(&synth.source_commit),
        toml_str(&synth.family),
        ops.join(", "),
        synth.seed,
        parents.join(", "),
        d.num_mutations,
        d.files,
        d.f2p_count,
        d.entity_complexity,
        synth.validation.reference_seconds,
        synth.validation.bug_seconds,
        toml_str(synth.issue["generator"].as_str().unwrap_or("template")),
    );
    std::fs::write(dir.join("task.toml"), toml)?;
    let image = inst.image.clone().unwrap_or_else(|| format!("frognano-synth/{}:latest", inst.repo.replace('/', "__")));
    std::fs::write(
        dir.join("environment/Dockerfile"),
        format!(
            "FROM {image}\nWORKDIR /app\n# The buggy tree is the single orphan commit {commit} of the task repository\n\
# (refs/heads/task/{id}); no other history is present in the image.\n",
            commit = inst.base_commit,
            id = inst.instance_id
        ),
    )?;
    std::fs::write(dir.join("tests/instance.json"), serde_json::to_string_pretty(&inst.to_json())?)?;
    let test_sh = format!(
        "#!/bin/bash\n# Runs the tests, grades the log with the SWE-bench v5 rules (frognano eval grade-log),\n\
# writes 1 to /logs/verifier/reward.txt iff the resolution is FULL.\nset -uo pipefail\nmkdir -p /logs/verifier\ncd /app\n\
# The grader reads only what lies between the two markers, so they go into the log itself.\n\
{{ echo \"+ : '>>>>> Start Test Output'\"; {cmd}; echo \"+ : '>>>>> End Test Output'\"; }} \\\n    > /logs/verifier/test_output.txt 2>&1\n\
here=\"$(cd \"$(dirname \"$0\")\" && pwd)\"\n\
# The report goes to a file first: `grep -q` closing a pipe early would fail the grader under pipefail.\n\
frognano eval grade-log --instance \"$here/instance.json\" --log /logs/verifier/test_output.txt \\\n\
    > /logs/verifier/report.json\n\
if grep -q '\"resolved\": true' /logs/verifier/report.json; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n",
        cmd = inst.test_cmd.as_deref().unwrap_or("true")
    );
    std::fs::write(dir.join("tests/test.sh"), test_sh)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("tests/test.sh"), std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}
