//! `serve --session-dir`: a conversation's next turn after a restart of the server starts from
//! the state saved on disk, not from an empty one, and replies as an uninterrupted server would.

use crate::common;

use common::*;
use frognano_serve::spawn_server;
use serde_json::{json, Value};

fn chat(url: &str, messages: &Value) -> Value {
    let body = json!({"model": "qwen35-tiny", "messages": messages, "max_tokens": 8, "temperature": 0});
    let (status, reply) = post(&format!("{url}/v1/chat/completions"), &body);
    assert_eq!(status, 200, "{reply}");
    reply
}

fn cached(reply: &Value) -> u64 {
    reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

#[test]
fn a_conversation_resumes_from_disk_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(&tiny());
    a.session_dir = Some(dir.path().to_path_buf());
    let turn1 = json!([{"role": "user", "content": "Read src/lib.rs and tell me what parse_header does."}]);
    let first = {
        let server = spawn_server(a.clone()).unwrap();
        chat(&server.url(), &turn1)
    };
    let reply = first["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let turn2 = json!([
        turn1[0],
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Now fix the off-by-one in it."}
    ]);

    let server = spawn_server(a.clone()).unwrap();
    let second = chat(&server.url(), &turn2);
    let turn1_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached(&second) >= turn1_prompt,
        "turn 2 after the restart reuses at least turn 1's {turn1_prompt} prompt tokens: {}",
        second["usage"]
    );
    let (_, health) = get(&format!("{}/health", server.url()));
    assert_eq!(health["restored_sessions"], 1, "{health}");
    assert!(health["session_store"]["files"].as_u64().unwrap() >= 2, "{health}");

    // The same reply as a server that never restarted (and keeps no states on disk).
    let plain = spawn_server(args(&tiny())).unwrap();
    chat(&plain.url(), &turn1);
    let uninterrupted = chat(&plain.url(), &turn2);
    assert_eq!(second["choices"][0]["message"], uninterrupted["choices"][0]["message"]);
    let (_, health) = get(&format!("{}/health", plain.url()));
    assert_eq!(health["session_store"], Value::Null);
}

#[test]
fn a_session_dir_that_cannot_be_made_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let mut a = args(&tiny());
    a.session_dir = Some(file.join("sessions"));
    let e = format!("{:#}", spawn_server(a).err().expect("refused"));
    assert!(e.contains("--session-dir") && e.contains("a-file"), "{e}");
}

/// Qwen3.5's template renders an assistant reply without its empty `<think></think>` once a
/// newer user message follows, so turn 2's prompt leaves turn 1's at the generation prompt,
/// not at its end. The hybrid model cannot cut its recurrent state back, so turn 2 reuses
/// turn 1 only through the state kept where turn 1's generation prompt began (the chat
/// request's checkpoint): everything but those few tokens, and so on every turn.
#[test]
fn a_chat_turn_resumes_where_the_last_one_left_the_conversation() {
    let server = qwen_server(None);
    let url = server.url();
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent. Fix the issue you are given."}),
        json!({"role": "user", "content": "Issue: parse() drops the last line.\n".repeat(20)}),
    ];
    let mut last_prompt = 0;
    for turn in 1..=3 {
        let reply = chat(&url, &json!(messages));
        let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
        if turn > 1 {
            assert!(
                cached(&reply) + 32 >= last_prompt && cached(&reply) < prompt,
                "turn {turn}: {} of {prompt} prompt tokens reused; turn {} had {last_prompt}",
                cached(&reply),
                turn - 1
            );
        }
        last_prompt = prompt;
        let text = reply["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
        messages.push(json!({"role": "assistant", "content": text}));
        messages.push(json!({"role": "user", "content": format!("Tool result {turn}:\n{}", "ok\n".repeat(30))}));
    }
}
