//! Test statuses and the status map a log parser produces.

use indexmap::IndexMap;

/// A parsed log: test id → raw status token, in first-insertion order.
///
/// Re-assigning a key keeps its original position, as a Python dict does; the order matters
/// because prefix matching of truncated ids takes the first match in map order.
pub type StatusMap = IndexMap<String, String>;

/// swebench's `TestStatus`: the five statuses a parser may record (there is no XPASS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TestStatus {
    /// The test failed.
    Failed,
    /// The test passed.
    Passed,
    /// The test was skipped.
    Skipped,
    /// The test errored (setup/teardown or collection error).
    Error,
    /// The test failed as expected.
    Xfail,
}

impl TestStatus {
    /// All statuses, in swebench's enum order.
    pub const ALL: [TestStatus; 5] =
        [TestStatus::Failed, TestStatus::Passed, TestStatus::Skipped, TestStatus::Error, TestStatus::Xfail];

    /// The status token as it appears in logs and status maps.
    pub fn as_str(self) -> &'static str {
        match self {
            TestStatus::Failed => "FAILED",
            TestStatus::Passed => "PASSED",
            TestStatus::Skipped => "SKIPPED",
            TestStatus::Error => "ERROR",
            TestStatus::Xfail => "XFAIL",
        }
    }
}
