//! The units of synthesis that run on a cluster (`frognano synth … --ray`, `frognano synth
//! batch … --ray`; docs/scale-out.md):
//!
//! - `synth_candidate`: one candidate's validation ([`crate::pipeline::validate_unit`]).
//!   Validating candidates is where a single package's time goes (the suite runs two or three
//!   times per candidate), while intake, environment and baseline happen once; so a package
//!   run keeps those in the driver and sends each candidate out, and the driver records every
//!   verdict as a local worker's.
//! - `synth_package`: one package of a batch ([`crate::batch::package_unit_run`]). In a batch
//!   the package is the natural unit: its environment build and baseline are as heavy as its
//!   candidates, are needed by every one of them, and are built on (and for) the node that
//!   uses them; packages share nothing, so they spread over nodes without any coordination.

use serde_json::Value;

/// Runs one synthesis unit (the worker's side, `frognano unit`).
pub fn run_unit(unit: &Value) -> anyhow::Result<Value> {
    match unit["kind"].as_str() {
        Some("synth_candidate") => crate::pipeline::validate_unit(unit),
        Some("synth_package") => crate::batch::package_unit_run(unit),
        other => anyhow::bail!("unit field `kind`: expected \"synth_candidate\" or \"synth_package\", found {other:?}"),
    }
}
