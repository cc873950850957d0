//! `frognano-rl`: online reinforcement learning of the coding agent on synthesized tasks
//! (docs/rl.md).
//!
//! One training step: sample tasks from the frontier curriculum ([`curriculum`]), run G agent
//! attempts per task with the current policy ([`rollout`], [`env`]), score them with the
//! task's tests, turn rewards into leave-one-out advantages and a clipped token loss
//! ([`loss`]), back-propagate through our own model code written in candle ([`policy`]), step
//! AdamW ([`optim`]), and hand the new weights to the rollout engine. [`trainer`] runs that
//! loop with checkpoints and exact resume; [`store`] keeps every rollout; [`metrics`] logs and
//! plots; [`graded_toy`] and [`experiment`] measure what the frontier curriculum buys on a
//! toy with a difficulty knob; [`tinker`] sends the gradient work to a Tinker-compatible server instead; [`train`]
//! is `frognano train` as a typed config and its run (the flags are in `crates/cli`).

pub mod curriculum;
pub mod env;
pub mod experiment;
pub mod graded_toy;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod policy;
pub mod remote;
pub mod rollout;
pub mod store;
pub mod tinker;
pub mod toy;
pub mod train;
pub mod trainer;
