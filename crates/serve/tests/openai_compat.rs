//! What OpenAI clients send and expect, on templates that are not Qwen's: the message shapes
//! the openai SDK, litellm and mini-swe-agent send back (a tool-only assistant turn with
//! `content: null` or none, list-of-parts content for every role), the OpenAI sampling
//! parameters (`presence_penalty`, `frequency_penalty`, `logit_bias`), the same text streamed
//! and not, the endpoints without `/v1`, and errors that do not show the server's paths.
//!
//! Most tests run the demo model (SmolLM2-135M-Instruct, Q4_1; its template concatenates
//! `message['content']` as a string), found by `frognano_testkit::demo_model`; where it has
//! not been fetched they say so on a `SKIPPED` line (with `FROGNANO_REQUIRE_FIXTURES` set, CI,
//! a missing model fails instead). The rest use the tiny checkpoint, whose ChatML template
//! has the same string-only form.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use frognano_engine::EngineLlm;
use frognano_protocol::{ChatRequest, HttpLlm, Llm, Message, Sampling};
use frognano_serve::{spawn_server, spawn_server_with_model, ServerHandle};
use serde_json::{json, Value};

/// The demo model's path, absolute (as a server would be given it).
fn smol_path() -> Option<String> {
    let p = frognano_testkit::demo_model()?;
    Some(std::fs::canonicalize(p).expect("demo model path").to_string_lossy().into_owned())
}

/// One SmolLM2 server shared by the tests of this file (loading it once keeps them fast).
fn smol() -> Option<&'static ServerHandle> {
    static SERVER: OnceLock<Option<ServerHandle>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let mut a = args(&smol_path()?);
            a.model_name = Some("smol".into());
            Some(spawn_server(a).expect("the demo model serves"))
        })
        .as_ref()
}

fn chat_url(s: &ServerHandle) -> String {
    format!("{}/v1/chat/completions", s.url())
}

/// The prompt `/tokenize` renders for `messages`.
fn rendered(s: &ServerHandle, messages: &Value) -> String {
    let (st, r) = post(&format!("{}/tokenize", s.url()), &json!({"messages": messages}));
    assert_eq!(st, 200, "{r}");
    r["prompt"].as_str().unwrap().to_string()
}

fn content(r: &Value) -> &str {
    r["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("no content: {r}"))
}

fn parts(text: &str) -> Value {
    json!([{"type": "text", "text": text}])
}

/// A Bash call as an OpenAI server returns it, with the extra fields the openai SDK's
/// `model_dump()` adds (`refusal`, `annotations`, `audio`, `function_call`).
fn tool_only_turn() -> Value {
    json!({"role": "assistant", "content": null, "refusal": null, "annotations": [], "audio": null,
        "function_call": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}]})
}

#[test]
fn a_tool_only_assistant_turn_sent_back_as_the_server_wrote_it_is_accepted() {
    let Some(s) = smol() else { return };
    let mut no_content = tool_only_turn();
    no_content.as_object_mut().unwrap().remove("content");
    for turn in [tool_only_turn(), no_content] {
        let messages = json!([{"role": "user", "content": "List the files."}, turn,
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"}]);
        let (st, r) = post(
            &chat_url(s),
            &json!({"messages": messages, "tools": [bash_tool()], "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(st, 200, "{r}");
        // No content reads as empty text; the tool result follows.
        let mut empty = messages.clone();
        empty[1]["content"] = json!("");
        let prompt = rendered(s, &messages);
        assert_eq!(prompt, rendered(s, &empty));
        assert!(prompt.contains("a.py\nb.py"), "{prompt}");
    }

    // The server's own reply, verbatim: a scripted Qwen3.5 server's tool call, echoed into a
    // conversation with the SmolLM2 server, as an agent does on its second turn.
    let qwen = qwen_server(Some(
        "</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
    ));
    let (st, reply) = post(
        &chat_url(&qwen),
        &json!({"messages": [{"role": "user", "content": "List the files."}], "tools": [bash_tool()]}),
    );
    assert_eq!(st, 200, "{reply}");
    let echoed = reply["choices"][0]["message"].clone();
    assert!(echoed["content"].is_null() && echoed["tool_calls"].is_array(), "{echoed}");
    let call_id = echoed["tool_calls"][0]["id"].clone();
    let messages = json!([{"role": "user", "content": "List the files."}, echoed,
        {"role": "tool", "tool_call_id": call_id, "content": "a.py"}]);
    let (st, r) = post(&chat_url(s), &json!({"messages": messages, "tools": [bash_tool()], "max_tokens": 4}));
    assert_eq!(st, 200, "{r}");
}

#[test]
fn list_of_parts_content_renders_like_plain_text_for_every_role() {
    let Some(s) = smol() else { return };
    let plain = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "Running ls.", "tool_calls": tool_only_turn()["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    ]);
    let mut as_parts = plain.clone();
    for m in as_parts.as_array_mut().unwrap() {
        let text = m["content"].as_str().unwrap().to_string();
        // Split in two parts: they are joined with nothing in between.
        let (a, b) = text.split_at(text.len() / 2);
        m["content"] = json!([{"type": "text", "text": a}, {"type": "text", "text": b}]);
    }
    assert_eq!(rendered(s, &as_parts), rendered(s, &plain));
    let greedy = |messages: &Value| {
        let (st, r) = post(&chat_url(s), &json!({"messages": messages, "max_tokens": 6, "temperature": 0}));
        assert_eq!(st, 200, "{r}");
        content(&r).to_string()
    };
    assert_eq!(greedy(&as_parts), greedy(&plain));
    // A conversation of one message in parts, for the roles that can open one.
    for role in ["system", "user"] {
        let (st, r) =
            post(&chat_url(s), &json!({"messages": [{"role": role, "content": parts("Say hi.")}], "max_tokens": 2}));
        assert_eq!(st, 200, "{role}: {r}");
    }
}

#[test]
fn a_part_that_is_not_text_is_refused_by_its_type() {
    let Some(s) = smol() else { return };
    let (st, r) = post(
        &chat_url(s),
        &json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    );
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["param"], "messages[1].content");
    assert_eq!(
        r["error"]["message"],
        "messages[1].content[1] is a part of type \"image_url\"; this model reads text only (parts of type \"text\")"
    );
    let (st, r) = post(&chat_url(s), &json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}));
    assert_eq!(st, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("content[0] is a \"text\" part without a `text`"), "{r}");
    // A tool's output is not the client's to take back: a part it cannot read is a note, so
    // that an agent's session goes on after a tool returns a picture or a sound.
    let (st, r) = post(
        &format!("{}/tokenize", s.url()),
        &json!({"messages": [{"role": "user", "content": "Listen."},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "input_audio"}]}]}),
    );
    assert_eq!(st, 200, "{r}");
    assert!(r["prompt"].as_str().unwrap().contains(frognano_protocol::NOT_READ_PART), "{r}");
}

/// The chosen token and the model's top alternatives at each step of a greedy chat reply,
/// from `logprobs` (the model's own, unadjusted distribution), keyed by token bytes.
type Steps = Vec<(Vec<u8>, Vec<(Vec<u8>, f64)>)>;

fn greedy_steps(s: &ServerHandle, extra: Value) -> (String, Steps) {
    let mut body = json!({"messages": [{"role": "user", "content": "Say frog frog frog frog frog frog frog frog"}],
        "max_tokens": 20, "temperature": 0, "logprobs": true, "top_logprobs": 20});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (st, r) = post(&chat_url(s), &body);
    assert_eq!(st, 200, "{r}");
    let bytes =
        |v: &Value| v["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect::<Vec<_>>();
    let steps = r["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let top = e["top_logprobs"].as_array().unwrap().iter().map(|t| (bytes(t), t["logprob"].as_f64().unwrap()));
            (bytes(e), top.collect())
        })
        .collect();
    (content(&r).to_string(), steps)
}

/// Replays a greedy reply under OpenAI's rule, `logit -= count × frequency + (count > 0) ×
/// presence` over the tokens generated so far in this reply (the prompt does not count):
/// every chosen token must be the best penalised candidate among the model's top 20.
fn check_penalised_greedy(steps: &Steps, frequency: f64, presence: f64) -> usize {
    let mut counts: HashMap<&[u8], f64> = HashMap::new();
    let mut penalised_steps = 0;
    for (i, (chosen, top)) in steps.iter().enumerate() {
        let adjusted = |t: &[u8], lp: f64| {
            let c = counts.get(t).copied().unwrap_or(0.0);
            lp - c * frequency - if c > 0.0 { presence } else { 0.0 }
        };
        let (best, best_score) =
            top.iter().map(|(t, lp)| (t, adjusted(t, *lp))).max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        // A token outside the top 20 scores at most the 20th's raw log-probability.
        assert!(best_score >= top.last().unwrap().1, "step {i}: the top 20 do not decide the pick");
        let chosen_score = top.iter().find(|(t, _)| t == chosen).map(|(t, lp)| adjusted(t, *lp)).unwrap();
        assert!(
            best == chosen || (best_score - chosen_score).abs() < 1e-4,
            "step {i}: chose {:?} ({chosen_score}), but {:?} scores {best_score} under the penalties",
            String::from_utf8_lossy(chosen),
            String::from_utf8_lossy(best)
        );
        if top[0].0 != *chosen {
            penalised_steps += 1;
        }
        *counts.entry(chosen).or_default() += 1.0;
    }
    penalised_steps
}

#[test]
fn presence_and_frequency_penalties_apply_openais_rule_to_the_reply() {
    let Some(s) = smol() else { return };
    let (plain, steps) = greedy_steps(s, json!({}));
    assert_eq!(check_penalised_greedy(&steps, 0.0, 0.0), 0, "greedy without penalties takes the top token");
    for (frequency, presence) in [(1.5, 0.0), (0.0, 2.0), (0.8, 0.6)] {
        let (text, steps) = greedy_steps(s, json!({"frequency_penalty": frequency, "presence_penalty": presence}));
        let overruled = check_penalised_greedy(&steps, frequency, presence);
        assert!(overruled > 0, "f={frequency} p={presence}: the penalties never changed a pick: {text:?}");
        assert_ne!(text, plain, "f={frequency} p={presence}");
    }
    let (st, r) =
        post(&chat_url(s), &json!({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5}));
    assert_eq!(st, 400, "{r}");
    assert_eq!(r["error"]["param"], "presence_penalty");
    assert!(r["error"]["message"].as_str().unwrap().contains("[-2, 2]"), "{r}");
    let (st, r) = post(
        &format!("{}/v1/completions", s.url()),
        &json!({"prompt": "frog frog frog frog", "max_tokens": 12, "temperature": 0, "frequency_penalty": 2.0}),
    );
    assert_eq!(st, 200, "{r}");
}

fn token_id(s: &ServerHandle, text: &str) -> u64 {
    let (_, tok) = post(&format!("{}/tokenize", s.url()), &json!({"prompt": text, "add_special_tokens": false}));
    let ids = tok["tokens"].as_array().unwrap();
    assert_eq!(ids.len(), 1, "{text:?} is one token: {tok}");
    ids[0].as_u64().unwrap()
}

#[test]
fn logit_bias_forces_bans_and_names_a_bad_key() {
    let Some(s) = smol() else { return };
    let frog = token_id(s, " frog");
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 5});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        post(&chat_url(s), &body)
    };
    // +100 forces the token, greedy or sampled.
    for extra in [json!({"temperature": 0}), json!({"temperature": 1.0, "seed": 3})] {
        let mut e = extra.clone();
        e["logit_bias"] = json!({frog.to_string(): 100});
        let (st, r) = ask(e);
        assert_eq!(st, 200, "{r}");
        assert_eq!(content(&r), " frog".repeat(5), "{extra}");
    }
    // -100 bans the greedy choice: the first token changes.
    let (_, plain) = ask(json!({"temperature": 0, "logprobs": true}));
    let first = &plain["choices"][0]["logprobs"]["content"][0]["token"];
    let first_id = token_id(s, first.as_str().unwrap());
    let (_, banned) = ask(json!({"temperature": 0, "logprobs": true, "logit_bias": {first_id.to_string(): -100}}));
    assert_ne!(&banned["choices"][0]["logprobs"]["content"][0]["token"], first, "{banned}");
    // Completions too.
    let (st, r) = post(
        &format!("{}/v1/completions", s.url()),
        &json!({"prompt": "The", "max_tokens": 3, "temperature": 0, "logit_bias": {frog.to_string(): 100}}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["text"], " frog frog frog");

    for (bias, needle) in [
        (json!({"frog": 5}), "logit_bias key \"frog\" is not a token id"),
        (json!({"99999999": 5}), "logit_bias key \"99999999\" is outside the vocabulary"),
        (json!({frog.to_string(): 150}), "must be a number from -100 to 100, found 150"),
    ] {
        let (st, r) = ask(json!({"logit_bias": bias}));
        assert_eq!(st, 400, "{r}");
        assert_eq!(r["error"]["param"], "logit_bias");
        assert!(r["error"]["message"].as_str().unwrap().contains(needle), "{r}");
    }
}

/// The content of a streamed chat reply, its chunks joined.
fn streamed_content(url: &str, body: &Value) -> String {
    let mut body = body.clone();
    body["stream"] = json!(true);
    chunks(&stream(url, &body))
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn streamed_and_whole_replies_carry_the_same_text_on_the_same_seed() {
    // A reply that starts and ends with white space, written by a scripted model with the
    // tiny checkpoint's ChatML template: nothing may be trimmed.
    // (Not a leading newline: the scripted model would take the prompt's last "\n" for it.)
    let reply = "  Two spaces, then the answer. \n\n";
    let loaded = scripted(frognano_model::load(tiny()).unwrap(), reply);
    let scripted_server = spawn_server_with_model(loaded, args("scripted")).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "go"}]});
    let (st, whole) = post(&chat_url(&scripted_server), &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(content(&whole), reply);
    assert_eq!(streamed_content(&chat_url(&scripted_server), &body), reply);

    let Some(s) = smol() else { return };
    for seed in [1, 2, 3] {
        let body = json!({"messages": [{"role": "user", "content": "Write one line about ponds."}],
            "temperature": 1.0, "seed": seed, "max_tokens": 16, "presence_penalty": 0.5, "frequency_penalty": 0.5});
        let (st, whole) = post(&chat_url(s), &body);
        assert_eq!(st, 200, "{whole}");
        assert_eq!(streamed_content(&chat_url(s), &body), content(&whole), "seed {seed}");
    }
}

#[test]
fn the_openai_endpoints_answer_without_the_v1_prefix() {
    let s = tiny_server();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    let (st, with) = post(&format!("{}/v1/chat/completions", s.url()), &body);
    assert_eq!(st, 200, "{with}");
    let (st, without) = post(&format!("{}/chat/completions", s.url()), &body);
    assert_eq!(st, 200, "{without}");
    assert_eq!(content(&without), content(&with));
    let text = json!({"prompt": "The frog", "max_tokens": 4, "temperature": 0});
    let (st, a) = post(&format!("{}/v1/completions", s.url()), &text);
    let (st2, b) = post(&format!("{}/completions", s.url()), &text);
    assert_eq!((st, st2), (200, 200), "{a} {b}");
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let (st, models) = get(&format!("{}/models", s.url()));
    assert_eq!((st, models["data"][0]["id"].as_str()), (200, Some("qwen35-tiny")));
    let (st, one) = get(&format!("{}/models/qwen35-tiny", s.url()));
    assert_eq!((st, one["id"].as_str()), (200, Some("qwen35-tiny")));
    let streamed = streamed_content(&format!("{}/chat/completions", s.url()), &body);
    assert_eq!(streamed, content(&with));
}

/// Whether `text` names a path from the root of a file system.
fn shows_an_absolute_path(text: &str) -> bool {
    text.split(|c: char| c.is_whitespace() || "\"'`(),:".contains(c)).any(|w| w.starts_with('/') && w.len() > 1)
}

#[test]
fn errors_never_show_the_servers_paths() {
    let root = std::fs::canonicalize(root()).unwrap().to_string_lossy().into_owned();
    // The Qwen3.5 template (loaded from the fixtures by an absolute path with `..` in it)
    // raising on a late system message.
    let qwen = qwen_server(None);
    let (st, r) = post(
        &chat_url(&qwen),
        &json!({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]}),
    );
    assert_eq!(st, 400, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("System message must be at the beginning"), "{msg}");
    assert!(msg.contains("chat_template.jinja"), "the file is still named: {msg}");
    assert!(!shows_an_absolute_path(msg) && !msg.contains(&root), "{msg}");

    // The tiny checkpoint served from its absolute folder: its template refused a kwarg.
    let tiny = tiny_server();
    let (st, r) = post(
        &chat_url(&tiny),
        &json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"tools": 1}}),
    );
    assert_eq!(st, 400, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("tokenizer_config.json") && msg.contains("`tools`"), "{msg}");
    assert!(!shows_an_absolute_path(msg) && !msg.contains(&root), "{msg}");
    // /tokenize goes through the same door.
    let (st, r) = post(
        &format!("{}/tokenize", tiny.url()),
        &json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": 1}}),
    );
    assert_eq!(st, 400, "{r}");
    assert!(!shows_an_absolute_path(r["error"]["message"].as_str().unwrap()), "{r}");

    // The demo model, served by its absolute path.
    let Some(s) = smol() else { return };
    let (st, r) = post(
        &chat_url(s),
        &json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": 1}}),
    );
    assert_eq!(st, 400, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{msg}");
    assert!(!shows_an_absolute_path(msg) && !msg.contains(&root), "{msg}");
}

/// The in-process model (what `frognano solve --model` runs) and the server agree: the agent's
/// own tool-only turn (content `None`) renders, and the OpenAI parameters sent by `HttpLlm`
/// act on the server as they act in process.
#[test]
fn the_in_process_model_and_the_server_agree_on_shapes_and_parameters() {
    let (Some(path), Some(s)) = (smol_path(), smol()) else { return };
    let frog = token_id(s, " frog") as u32;
    let history = vec![
        Message::user("List the files."),
        Message::assistant_reply(None, None, vec![frognano_protocol::ToolCall::new("Bash", r#"{"command":"ls"}"#)]),
        Message::tool("call_x", "a.py"),
    ];
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: 4,
        enable_thinking: false,
        logit_bias: BTreeMap::from([(frog, 100.0)]),
        ..Sampling::default()
    };
    let request = ChatRequest::new(&history, &[], &sampling);
    let mut local = EngineLlm::load(&path).unwrap();
    let mut remote = HttpLlm::new(&s.url(), "smol", Duration::from_secs(60)).unwrap();
    let a = local.complete(&request).unwrap();
    let b = remote.complete(&request).unwrap();
    assert_eq!(a.message.text(), " frog".repeat(4));
    assert_eq!(b.message.text(), a.message.text());

    let penalised = Sampling { logit_bias: BTreeMap::new(), frequency_penalty: 1.5, presence_penalty: 0.5, ..sampling };
    let asks = [Message::user("Say frog frog frog frog frog frog frog frog")];
    let short = Sampling { max_tokens: 20, ..penalised };
    let request = ChatRequest::new(&asks, &[], &short);
    let a = local.complete(&request).unwrap();
    let b = remote.complete(&request).unwrap();
    assert_eq!(b.message.text(), a.message.text());
}
