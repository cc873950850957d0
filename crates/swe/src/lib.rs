//! Tasks and verification: SWE-bench / Harbor formats, patch apply, log parsers, grading,
//! reports — graded exactly as `swebench` 5.0.2 grades.
//!
//! Layers, bottom up (no module imports one above it): [`pytext`] (Python string semantics),
//! [`parsers`] (log → status map), [`grading`] (status map → report), [`instance`]
//! (SWE-bench instances and predictions, and how an instance is verified), [`localization`]
//! (where a gold patch changes the code, as a hint for the agent), [`env_record`]
//! (the recorded environment of a synthesized instance, rebuilt for grading), [`report`]
//! (swebench's report files), [`workspace`] (local workspace, patch chain, run results),
//! [`harbor`] (Harbor task dirs and their verifier), [`dataset`] (every instance format
//! behind one loader), [`executor`] (one instance run as its [`Verification`] says),
//! [`progress`] (progress reports of long jobs), [`remote`] (units of a run sent to another
//! executor, and their answers), [`ray`] (Ray as that executor), [`runs`] (grade and solve
//! runs over many instances, on threads here or remotely), [`eval`] (the configs and jobs of
//! `frognano eval`).

pub mod dataset;
pub mod env_record;
pub mod eval;
pub mod eval_script;
pub mod executor;
pub mod grading;
pub mod harbor;
pub mod instance;
pub mod localization;
pub mod parquet;
pub mod parsers;
pub mod progress;
pub mod pyjson;
pub mod pytext;
pub mod ray;
pub mod remote;
pub mod report;
pub mod runs;
pub mod status;
pub mod workspace;

pub use dataset::load_instances;
pub use grading::{eval_report, EvalType, Grade, GradingSpec, ResolutionStatus, TestsReport};
pub use instance::{load_predictions, Prediction, SweInstance, Verification};
pub use parsers::{parse_log, StatusMap};
