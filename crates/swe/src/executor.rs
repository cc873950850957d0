//! Local executor (no Docker): one git workspace per instance at `base_commit` with later
//! history invisible ([`crate::workspace`]), the model patch applied with swebench 5.0.2's
//! fallback chain, then the instance verified as its [`Verification`] says: the eval script
//! run in `frognano-sandbox` under a timeout and the log graded, or a Harbor verifier.

use std::path::Path;
use std::time::Instant;

use crate::eval_script::{local_eval_script, rewrite_eval_script};
use crate::grading::eval_report;
use crate::instance::{Prediction, SweInstance, Verification};
use crate::report::{instance_report_text, LOG_INSTANCE, LOG_REPORT, LOG_TEST_OUTPUT};
use crate::workspace::{patched_workspace, run_merged};
// The workspace's types and steps were part of this module; their paths stay valid here.
pub use crate::workspace::{
    apply_patch_chain, create_workspace, instance_readable_paths, ErrorKind, ExecOptions, InstanceResult, Outcome,
    GIT_APPLY_CMDS, READABLE_PATHS_KEY,
};

/// The eval script for an instance in workspace `ws`: generated from `test_cmd` when given,
/// else the dataset's v5 `eval_script` rewritten by swebench's rules with `/testbed`
/// replaced by the workspace.
pub fn eval_script_for(inst: &SweInstance, ws: &Path) -> anyhow::Result<String> {
    let ws_str = ws.to_string_lossy();
    if let Some(cmd) = &inst.test_cmd {
        return Ok(local_eval_script(&ws_str, &inst.base_commit, &inst.test_patch, cmd, &inst.setup_commands));
    }
    if let Some(script) = &inst.eval_script {
        return Ok(rewrite_eval_script(&script.replace("/testbed", &ws_str)));
    }
    anyhow::bail!(
        "instance {}: needs `test_cmd` (FrogNano) or `eval_script` (SWE-bench v5) to run locally",
        inst.instance_id
    )
}

/// Runs one prediction end to end and writes swebench's per-instance files into `log_dir`
/// (`patch.diff`, `run_instance.log`, `eval.sh`, `test_output.txt`, `report.json` when graded).
pub fn run_instance(inst: &SweInstance, pred: &Prediction, opts: &ExecOptions, log_dir: &Path) -> InstanceResult {
    let started = Instant::now();
    let mut result = InstanceResult {
        instance_id: inst.instance_id.clone(),
        outcome: Outcome::EmptyPatch,
        report: None,
        patch_applied: false,
        seconds: 0.0,
        test_seconds: 0.0,
    };
    if pred.is_empty_patch() {
        return result;
    }
    if let Err(e) = std::fs::create_dir_all(log_dir) {
        result.outcome = Outcome::Error(ErrorKind::Infra(format!("cannot create log dir {}: {e}", log_dir.display())));
        return result;
    }
    let mut instance_log = String::new();
    let outcome = run_instance_inner(inst, pred, opts, log_dir, &mut instance_log, &mut result);
    if let Err(kind) = outcome {
        instance_log.push_str(&format!("error: {}\n", Outcome::Error(kind.clone()).detail().unwrap_or_default()));
        result.outcome = Outcome::Error(kind);
    }
    std::fs::write(log_dir.join(LOG_INSTANCE), instance_log).ok();
    result.seconds = started.elapsed().as_secs_f64();
    result
}

fn run_instance_inner(
    inst: &SweInstance,
    pred: &Prediction,
    opts: &ExecOptions,
    log_dir: &Path,
    log: &mut String,
    result: &mut InstanceResult,
) -> Result<(), ErrorKind> {
    if let Verification::Harbor { task_dir } = &inst.verification {
        return crate::harbor::run_harbor_instance(inst, task_dir, pred, opts, log_dir, log, result);
    }
    let infra = |e: anyhow::Error| ErrorKind::Infra(format!("{e:#}"));
    // A synthesized task runs in a rebuild of the environment it was validated in.
    let rebuilt = crate::env_record::rebuilt_instance(inst).map_err(|e| ErrorKind::Environment(format!("{e:#}")))?;
    let inst = rebuilt.as_ref().unwrap_or(inst);
    let spec = inst.grading_spec().map_err(infra)?;
    let (_ws_holder, ws, sb) = patched_workspace(inst, pred, opts, log_dir, log, opts.timeout)?;
    result.patch_applied = true;
    let script = eval_script_for(inst, &ws).map_err(infra)?;
    std::fs::write(log_dir.join("eval.sh"), &script).map_err(|e| infra(e.into()))?;
    let script_file = ws.join(".git/frognano-eval.sh");
    std::fs::write(&script_file, &script).map_err(|e| infra(e.into()))?;
    let t0 = Instant::now();
    let (mut output, _code, timed_out) = run_merged(
        &sb,
        &format!("/bin/bash {}", crate::eval_script::shell_quote(&script_file.to_string_lossy())),
        opts.timeout,
    )
    .map_err(infra)?;
    result.test_seconds = t0.elapsed().as_secs_f64();
    if timed_out {
        let secs = opts.timeout.as_secs();
        output.push_str(&format!("\n\nTimeout error: {secs} seconds exceeded."));
        std::fs::write(log_dir.join(LOG_TEST_OUTPUT), &output).map_err(|e| infra(e.into()))?;
        return Err(ErrorKind::TestTimeout(secs));
    }
    std::fs::write(log_dir.join(LOG_TEST_OUTPUT), &output).map_err(|e| infra(e.into()))?;
    let grade = eval_report(&spec, Some(pred.model_patch.as_deref().unwrap_or("")), output.as_bytes())
        .map_err(|e| ErrorKind::Infra(format!("grader error: {e}")))?;
    std::fs::write(log_dir.join(LOG_REPORT), instance_report_text(&grade.report)).map_err(|e| infra(e.into()))?;
    result.outcome = if grade.resolved { Outcome::Resolved } else { Outcome::Unresolved };
    result.report = Some(grade.report);
    Ok(())
}
