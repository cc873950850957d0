//! Progress of a long job (grading many instances, validating bug candidates, training
//! steps), reported to whoever runs it. The libraries only count; drawing a bar is the
//! binary's business (`crates/cli` implements this with indicatif). It lives in this crate
//! because it is the lowest one with long jobs: `synth` and `rl` build on it.

/// Receives the progress of one job. Methods take `&self` because jobs report from their
/// worker threads.
pub trait Progress: Send + Sync {
    /// The job starts: `total` units of work, `done` of them finished already (a resumed
    /// run), `label` naming the job (e.g. `grade`).
    fn start(&self, label: &str, total: u64, done: u64);
    /// `n` more units are finished.
    fn inc(&self, n: u64);
    /// The job found `n` more units of work than it announced.
    fn add_total(&self, n: u64);
    /// A short status shown next to the count (e.g. `resolved 3, errors 0`).
    fn message(&self, text: &str);
    /// A line of output that must not be overdrawn by the progress display.
    fn println(&self, line: &str);
    /// The job is over.
    fn finish(&self);
}

/// Reports nothing: for library callers and tests that want no output.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _label: &str, _total: u64, _done: u64) {}
    fn inc(&self, _n: u64) {}
    fn add_total(&self, _n: u64) {}
    fn message(&self, _text: &str) {}
    fn println(&self, _line: &str) {}
    fn finish(&self) {}
}
