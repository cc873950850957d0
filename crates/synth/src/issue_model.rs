//! Model-written issue text: a model (any [`Llm`] backend: in process or an HTTP endpoint)
//! turns the failing checks' observations — what was called, what was expected, what
//! happened; never the diff — into a short GitHub-style issue. Every reply goes through
//! [`leak_problems`]; a reply that leaks (or a failed request) is retried, and after the
//! last attempt the template text is used. The task records which generator wrote its text.

use std::sync::Mutex;

use frognano_protocol::{ChatRequest, Llm, Message, Sampling};
use serde_json::{json, Value};

use crate::issue::{leak_problems, observe, IssueContext};

/// Version tag of the prompt below, recorded with each model-written issue.
pub const PROMPT_VERSION: &str = "observed-llm-v1";

/// Version tag of the template text, recorded when the template is used.
pub const TEMPLATE_VERSION: &str = "observed-v1";

/// Attempts per task by default (the first try and two retries).
pub const DEFAULT_ATTEMPTS: usize = 3;

/// A model shared by all pipeline workers (one request at a time).
pub struct IssueModel {
    llm: Mutex<Box<dyn Llm + Send>>,
    description: String,
    attempts: usize,
}

impl std::fmt::Debug for IssueModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssueModel").field("model", &self.description).field("attempts", &self.attempts).finish()
    }
}

/// The issue text of one task and how it was produced.
#[derive(Debug, Clone, PartialEq)]
pub struct IssueOutcome {
    /// The problem statement.
    pub text: String,
    /// The `synth.issue` record: `generator` (`"model"` or `"template"`), `prompt_version`,
    /// and for model runs `model`, `attempts` and the reasons earlier replies were rejected.
    pub record: Value,
}

impl IssueOutcome {
    /// The template text, no model involved.
    pub fn template(text: String) -> Self {
        IssueOutcome { text, record: json!({"generator": "template", "prompt_version": TEMPLATE_VERSION}) }
    }
}

impl IssueModel {
    /// Wraps `llm`; each task gets up to `attempts` (at least 1) model replies.
    pub fn new(llm: Box<dyn Llm + Send>, attempts: usize) -> Self {
        let description = llm.describe();
        IssueModel { llm: Mutex::new(llm), description, attempts: attempts.max(1) }
    }

    /// The model's description (name and where it runs).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Issue text for `ctx`: the model's, if one of its replies passes the leak check,
    /// otherwise `template` (already leak-checked by its writer).
    pub fn write(&self, ctx: &IssueContext<'_>, template: &str) -> IssueOutcome {
        let mut llm = self.llm.lock().unwrap_or_else(|p| p.into_inner());
        write_issue(llm.as_mut(), &self.description, ctx, template, self.attempts)
    }
}

/// One line per failing check that could be read: call, expected, actual. Nothing from the
/// diff; bullets that would leak are dropped.
fn observation_lines(ctx: &IssueContext<'_>) -> Vec<String> {
    let mut lines = Vec::new();
    for t in ctx.fail_to_pass {
        if lines.len() >= 3 {
            break;
        }
        let Some(o) = observe(ctx.runner, ctx.bug_log, t, ctx.tree) else { continue };
        let Some(call) = o.call.as_ref().filter(|c| !c.contains("self.") && c.len() <= 160) else { continue };
        let mut line = format!("- Called: `{call}`");
        if let Some(e) = &o.expected {
            line.push_str(&format!("; expected: `{e}`"));
        }
        match (&o.actual, o.raised) {
            (Some(a), true) => line.push_str(&format!("; happened: raised `{a}`")),
            (Some(a), false) => line.push_str(&format!("; happened: returned `{a}`")),
            (None, _) => line.push_str("; happened: a different result"),
        }
        if !lines.contains(&line) && leak_problems(&line, ctx).is_empty() {
            lines.push(line);
        }
    }
    lines
}

/// The chat messages asking for an issue about `ctx`. Built from the observations (or, when
/// none could be read, from the leak-checked `template`), never from the diff.
pub fn issue_prompt(ctx: &IssueContext<'_>, template: &str) -> Vec<Message> {
    let system = "You write short bug reports for a software project's issue tracker, as a user of the \
                  library who noticed wrong behaviour. Describe only what you observed: what you called, \
                  what you expected and what happened. Do not guess at the cause, do not propose a fix, \
                  do not quote the library's source code, and do not mention any checks, check suites or \
                  tooling used to find the problem.";
    let obs = observation_lines(ctx);
    let subject = ctx.entities.first().map(|e| format!("The function involved is `{e}`.\n\n")).unwrap_or_default();
    let facts = if obs.is_empty() {
        format!("Here is a rough draft of the report:\n\n{}", template.trim())
    } else {
        format!("Observed behaviour:\n{}", obs.join("\n"))
    };
    let user = format!(
        "{subject}{facts}\n\nWrite the issue: a one-line title, a blank line, then a short body (at most 120 \
         words) in Markdown. Reply with the issue only."
    );
    vec![Message::system(system), Message::user(user)]
}

/// The reply's issue text: reasoning blocks and surrounding whitespace removed.
fn clean_reply(text: &str) -> String {
    let mut t = text;
    if let Some((_, after)) = t.split_once("</think>") {
        t = after;
    }
    t.trim().to_string()
}

/// Asks `llm` up to `attempts` times for an issue about `ctx`; the first reply that is non-empty
/// and passes [`leak_problems`] wins, else `template` is used. `description` names the model
/// in the record.
pub fn write_issue(
    llm: &mut dyn Llm,
    description: &str,
    ctx: &IssueContext<'_>,
    template: &str,
    attempts: usize,
) -> IssueOutcome {
    let messages = issue_prompt(ctx, template);
    let sampling = Sampling { enable_thinking: false, max_tokens: 400, ..Sampling::default() };
    let mut rejections: Vec<Value> = Vec::new();
    for attempt in 1..=attempts.max(1) {
        let request = ChatRequest::new(&messages, &[], &sampling);
        let problems = match llm.complete(&request) {
            Err(e) => vec![format!("request failed: {e}")],
            Ok(c) => {
                let text = clean_reply(&c.message.text());
                let problems =
                    if text.is_empty() { vec!["empty reply".to_string()] } else { leak_problems(&text, ctx) };
                if problems.is_empty() {
                    let mut text = text;
                    text.push('\n');
                    return IssueOutcome {
                        text,
                        record: json!({
                            "generator": "model",
                            "model": description,
                            "prompt_version": PROMPT_VERSION,
                            "attempts": attempt,
                            "rejections": rejections,
                        }),
                    };
                }
                problems
            }
        };
        tracing::debug!(attempt, ?problems, "model issue text rejected");
        rejections.push(json!(problems));
    }
    IssueOutcome {
        text: template.to_string(),
        record: json!({
            "generator": "template",
            "prompt_version": TEMPLATE_VERSION,
            "model": description,
            "attempts": attempts.max(1),
            "rejections": rejections,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::path::Path;

    use frognano_protocol::{Completion, FinishReason, LlmError};

    use super::*;
    use crate::issue::template_issue;
    use crate::project::TestRunner;

    /// Returns scripted replies in order and keeps the prompts it was sent.
    struct Scripted {
        replies: VecDeque<Result<String, String>>,
        prompts: Vec<Vec<Message>>,
    }

    impl Llm for Scripted {
        fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
            assert!(!request.sampling.enable_thinking && request.tools.is_empty());
            self.prompts.push(request.messages.to_vec());
            match self.replies.pop_front().expect("no scripted reply left") {
                Ok(text) => {
                    Ok(Completion { message: Message::assistant(text), finish_reason: FinishReason::Stop, usage: None })
                }
                Err(e) => Err(LlmError::Other(e)),
            }
        }
        fn describe(&self) -> String {
            "scripted".into()
        }
    }

    fn scripted(replies: Vec<Result<&str, &str>>) -> Scripted {
        Scripted {
            replies: replies.into_iter().map(|r| r.map(str::to_string).map_err(str::to_string)).collect(),
            prompts: vec![],
        }
    }

    const LOG: &str = "____ test_add ____\n\n    def test_add():\n>       assert add(2, 3) == 5\nE       assert -1 == 5\nE        +  where -1 = add(2, 3)\n\ntests/test_calc.py:4: AssertionError\n==== short test summary info ====\nFAILED tests/test_calc.py::test_add\n";
    const DIFF: &str = "--- a/calc.py\n+++ b/calc.py\n-    return a + b\n+    return a - b\n";

    fn with_ctx<R>(f: impl FnOnce(&IssueContext<'_>) -> R) -> R {
        let f2p = vec!["tests/test_calc.py::test_add".to_string()];
        let entities = vec!["add".to_string()];
        let operators = vec!["func_pm_op_change".to_string()];
        let ctx = IssueContext {
            runner: TestRunner::Pytest,
            bug_log: LOG,
            fail_to_pass: &f2p,
            pass_to_pass: &[],
            tree: Path::new("/nonexistent"),
            bug_diff: DIFF,
            entities: &entities,
            operators: &operators,
        };
        f(&ctx)
    }

    #[test]
    fn prompt_holds_observations_and_no_diff() {
        with_ctx(|ctx| {
            let msgs = issue_prompt(ctx, &template_issue(ctx));
            let user = msgs[1].text();
            assert!(user.contains("Called: `add(2, 3)`; expected: `5`; happened: returned `-1`"), "{user}");
            assert!(!user.contains("a + b") && !user.contains("a - b"), "{user}");
            assert!(!user.contains("test_add") && !user.contains("test_calc"), "{user}");
        });
    }

    #[test]
    fn leaking_reply_is_rejected_and_clean_retry_accepted() {
        with_ctx(|ctx| {
            let template = template_issue(ctx);
            let mut llm = scripted(vec![
                Ok("add is broken\n\nThe line `return a - b` should be `return a + b`."),
                Ok("add returns the wrong sum\n\nCalling `add(2, 3)` gives `-1`; I expected `5`."),
            ]);
            let out = write_issue(&mut llm, "scripted", ctx, &template, 3);
            assert_eq!(llm.prompts.len(), 2);
            assert!(out.text.starts_with("add returns the wrong sum"), "{}", out.text);
            assert!(leak_problems(&out.text, ctx).is_empty());
            assert_eq!(out.record["generator"], "model");
            assert_eq!(out.record["model"], "scripted");
            assert_eq!(out.record["attempts"], 2);
            let first = out.record["rejections"][0].to_string();
            assert!(first.contains("changed line of the diff"), "{first}");
        });
    }

    #[test]
    fn framework_words_and_errors_fall_back_to_the_template_with_reasons() {
        with_ctx(|ctx| {
            let template = template_issue(ctx);
            let mut llm = scripted(vec![
                Ok("The test for add fails."),
                Err("endpoint down"),
                Ok("<think>hmm</think>\n   "),
                Ok("never asked"),
            ]);
            let out = write_issue(&mut llm, "scripted", ctx, &template, 3);
            assert_eq!(llm.prompts.len(), 3, "at most one try and two retries");
            assert_eq!(out.text, template);
            assert_eq!(out.record["generator"], "template");
            let r = &out.record["rejections"];
            assert!(r[0].to_string().contains("uses the word \\\"test\\\""), "{r}");
            assert!(r[1].to_string().contains("endpoint down"), "{r}");
            assert_eq!(r[2], json!(["empty reply"]));
        });
    }

    #[test]
    fn shared_model_is_send_and_sync_and_records_its_description() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<IssueModel>();
        fn assert_send<T: Send>() {}
        assert_send::<frognano_engine::EngineLlm>();
        assert_send::<frognano_protocol::HttpLlm>();
        with_ctx(|ctx| {
            let m = IssueModel::new(Box::new(scripted(vec![Ok("Wrong sum from add\n\n`add(2, 3)` gives `-1`.")])), 3);
            let out = m.write(ctx, &template_issue(ctx));
            assert_eq!(out.record["generator"], "model");
            assert_eq!(out.record["model"], "scripted");
        });
    }
}
