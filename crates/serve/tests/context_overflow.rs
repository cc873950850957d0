//! A conversation longer than the context, as each API's clients expect to be told: Anthropic's
//! `prompt is too long: N tokens > M maximum` (Claude Code reads the two numbers and compacts),
//! the Responses API's `context_length_exceeded` with OpenAI's sentence, and Ollama's
//! `/api/chat`, which drops the oldest messages until the rest fits (`"truncate": false`
//! refuses instead). The real clients' side: codex.rs, claude_code.rs.

use crate::common;

use common::*;
use serde_json::{json, Value};

/// The server's context in these tests.
const CTX: usize = 512;

fn server() -> frognano_serve::ServerHandle {
    qwen_server_with_context(Some("</think>\n\nShort answer."), Some(CTX))
}

/// The two numbers Claude Code reads from an overflow, as its pattern
/// `prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)` (case-insensitive) finds them.
fn claude_code_numbers(message: &str) -> Option<(usize, usize)> {
    let lower = message.to_lowercase();
    let rest = &lower[lower.find("prompt is too long")? + "prompt is too long".len()..];
    let rest = rest.trim_start_matches(|c: char| !c.is_ascii_digit());
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    let actual = digits(rest);
    let rest = rest[actual.len()..].trim_start();
    let rest = rest.strip_prefix("tokens").or_else(|| rest.strip_prefix("token"))?.trim_start();
    let limit = digits(rest.strip_prefix('>')?.trim_start());
    Some((actual.parse().ok()?, limit.parse().ok()?))
}

#[test]
fn the_messages_api_says_prompt_is_too_long_with_both_sizes() {
    let server = server();
    let url = format!("{}/v1/messages", server.url());
    let words = "lorem ".repeat(2_000);
    let (status, body) = post(
        &url,
        &json!({"model": "qwen35-tiny", "max_tokens": 16, "messages": [{"role": "user", "content": words}]}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap();
    let (actual, limit) = claude_code_numbers(message).unwrap_or_else(|| panic!("not Anthropic's wording: {message}"));
    assert_eq!(limit, CTX, "{message}");
    assert!(actual > 2_000 && actual < 10_000, "the prompt's tokens, counted: {message}");

    // Refused by its size in bytes before it is tokenized: a lower bound, still read the same way.
    let huge = "lorem ".repeat(400_000);
    let (status, body) =
        post(&url, &json!({"model": "qwen35-tiny", "max_tokens": 16, "messages": [{"role": "user", "content": huge}]}));
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("prompt is too long: at least "), "{message}");
    let (actual, limit) = claude_code_numbers(message).unwrap_or_else(|| panic!("not Anthropic's wording: {message}"));
    assert!(actual >= CTX && limit == CTX, "{message}");
}

#[test]
fn the_responses_api_says_context_length_exceeded() {
    let server = server();
    let url = format!("{}/v1/responses", server.url());
    for stream in [false, true] {
        let request = json!({"model": "qwen35-tiny", "input": "lorem ".repeat(2_000), "stream": stream});
        let (status, body) = post(&url, &request);
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert_eq!(body["error"]["param"], "input");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("Your input exceeds the context window of this model"), "{message}");
        assert!(message.contains(&format!("the context holds {CTX}")), "{message}");
    }
}

/// A system message, `exchanges` question-and-answer pairs of 61 words each, and a last
/// question.
fn long_conversation(exchanges: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You answer in one line."})];
    for i in 0..exchanges {
        messages.push(json!({"role": "user", "content": format!("Question {i}: {}", "lorem ".repeat(60))}));
        messages.push(json!({"role": "assistant", "content": format!("Answer {i}: {}", "ipsum ".repeat(60))}));
    }
    messages.push(json!({"role": "user", "content": "Which question came last?"}));
    messages
}

fn ollama_chat(url: &str, messages: &[Value], truncate: Option<bool>) -> (u16, Option<usize>, Value) {
    let mut request = json!({"model": "qwen35-tiny", "messages": messages, "stream": false});
    if let Some(t) = truncate {
        request["truncate"] = json!(t);
    }
    let resp = match ureq::post(url).send_json(request) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let dropped = resp.header("x-frognano-messages-dropped").map(|v| v.parse().expect("a count"));
    (resp.status(), dropped, resp.into_json().expect("JSON body"))
}

#[test]
fn ollama_chat_drops_the_oldest_messages_to_fit_as_ollama_does() {
    let server = server();
    let url = format!("{}/api/chat", server.url());
    let messages = long_conversation(8);

    let (status, dropped, body) = ollama_chat(&url, &messages, None);
    assert_eq!(status, 200, "{body}");
    let dropped = dropped.expect("the reply says how many messages were dropped");
    let prompt_tokens = body["prompt_eval_count"].as_u64().unwrap() as usize;
    assert!(prompt_tokens < CTX, "{body}");
    assert!(dropped >= 2 && dropped < messages.len() - 1, "dropped {dropped} of {}", messages.len());
    assert_eq!(messages[dropped]["role"], "user", "the kept part begins a turn");
    assert_eq!(body["message"]["content"], "Short answer.");

    // What was kept is the system message and everything from the cut on: sent as such it is
    // the same prompt, and fits without a cut.
    let kept: Vec<Value> = std::iter::once(messages[0].clone()).chain(messages[dropped..].iter().cloned()).collect();
    let (status, again, body) = ollama_chat(&url, &kept, Some(false));
    assert_eq!((status, again), (200, None), "{body}");
    assert_eq!(body["prompt_eval_count"].as_u64().unwrap() as usize, prompt_tokens);

    // No more was dropped than needed: one more exchange does not fit.
    let one_more: Vec<Value> =
        std::iter::once(messages[0].clone()).chain(messages[dropped - 2..].iter().cloned()).collect();
    let (status, _, body) = ollama_chat(&url, &one_more, Some(false));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("maximum context length is 512"), "{body}");

    // `"truncate": false` refuses the whole conversation instead.
    let (status, _, body) = ollama_chat(&url, &messages, Some(false));
    assert_eq!(status, 400, "{body}");

    // A last message that cannot fit even alone is refused, naming the sizes.
    let alone = [json!({"role": "user", "content": "lorem ".repeat(1_000)})];
    let (status, _, body) = ollama_chat(&url, &alone, None);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("maximum context length is 512"), "{body}");
}
