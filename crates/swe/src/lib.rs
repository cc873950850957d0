//! Tasks and verification: SWE-bench / Harbor formats, patch apply, log parsers, grading,
//! reports — graded exactly as `swebench` 5.0.2 grades.
//!
//! Layers, bottom up: [`pytext`] (Python string semantics), [`parsers`] (log → status map),
//! [`grading`] (status map → report), [`instance`] / [`harbor`] (task formats),
//! [`report`] (swebench's report files), [`executor`] (local workspace, patch chain, test
//! run), [`runs`] (grade and solve runs over many instances), [`cli`] (`frognano eval`).

pub mod cli;
pub mod eval_script;
pub mod executor;
pub mod grading;
pub mod harbor;
pub mod instance;
pub mod parquet;
pub mod parsers;
pub mod pyjson;
pub mod pytext;
pub mod report;
pub mod runs;
pub mod status;

pub use grading::{eval_report, EvalType, Grade, GradingSpec, ResolutionStatus, TestsReport};
pub use instance::{load_instances, load_predictions, Prediction, SweInstance};
pub use parsers::{parse_log, StatusMap};
