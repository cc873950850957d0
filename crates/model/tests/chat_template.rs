//! Chat templates rendered with minijinja must equal transformers' `apply_chat_template`
//! byte for byte. References: fixtures/tokenizer/*_renders.json, produced by
//! scripts/make_chat_template_refs.py with transformers 5.23.0 (jinja2).

use std::path::{Path, PathBuf};

use frognano_model::chat::ChatTemplate;
use frognano_model::ModelError;
use frognano_protocol::Message;
use serde_json::{json, Map, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")
}

fn load_cases(name: &str) -> Vec<Value> {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            Value::Object(o.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

/// A typed message as the template sees it: its JSON without nulls, each tool call's
/// `arguments` string as the object it encodes.
fn as_template_sees_it(m: &Message) -> Value {
    let mut v = without_nulls(&serde_json::to_value(m).unwrap());
    if let Some(Value::Array(calls)) = v.get_mut("tool_calls") {
        for call in calls {
            let text = call["function"]["arguments"].as_str().unwrap().to_string();
            call["function"]["arguments"] = serde_json::from_str(&text).unwrap();
        }
    }
    v
}

/// Renders every case of a reference file, through raw JSON messages and (where the
/// messages survive a round trip through the typed Message) through typed messages.
fn check_reference_renders(template: &ChatTemplate, file: &str) -> usize {
    let cases = load_cases(file);
    assert!(!cases.is_empty());
    let mut typed_checked = 0;
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let messages = case["messages"].as_array().unwrap();
        let tools = case["tools"].as_array().map(|t| t.as_slice());
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let kwargs = case["kwargs"].as_object().unwrap();
        let got = template.render_json(messages, tools, agp, Some(kwargs));
        if let Some(expected) = case.get("expected").and_then(Value::as_str) {
            let got = got.unwrap_or_else(|e| panic!("{file} case {name}: {e}"));
            assert_eq!(got, expected, "{file} case {name}: render differs from transformers");

            let typed: Result<Vec<Message>, _> = serde_json::from_value(Value::Array(messages.clone()));
            if let Ok(typed) = typed {
                let back: Vec<Value> = typed.iter().map(as_template_sees_it).collect();
                let original: Vec<Value> = messages.iter().map(without_nulls).collect();
                if back == original {
                    let got = template.render(&typed, tools, agp, Some(kwargs)).unwrap();
                    assert_eq!(got, expected, "{file} case {name}: typed render differs");
                    typed_checked += 1;
                }
            }
        } else {
            let want = case["error"].as_str().unwrap();
            match got {
                Err(ModelError::Input(msg)) => {
                    assert!(msg.contains(want), "{file} case {name}: error {msg:?} lacks {want:?}")
                }
                other => panic!("{file} case {name}: expected an error containing {want:?}, got {other:?}"),
            }
        }
    }
    typed_checked
}

#[test]
fn qwen35_matches_transformers_on_every_reference_case() {
    let t = ChatTemplate::from_model_dir(fixtures().join("qwen35")).unwrap();
    let typed = check_reference_renders(&t, "qwen35_renders.json");
    assert!(typed >= 10, "only {typed} cases went through the typed path");
}

#[test]
fn qwen35_doc_example_bytes_from_typed_messages() {
    let t = ChatTemplate::from_model_dir(fixtures().join("qwen35")).unwrap();
    let bash = json!({"type": "function", "function": {"name": "Bash",
        "description": "Run a shell command in the repository workdir.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string",
        "description": "Command to run."}}, "required": ["command"]}}});
    let mut args = Map::new();
    args.insert("command".into(), json!("ls -la"));
    args.insert("timeout".into(), json!(30));
    let messages = vec![
        Message::system("You are a software-engineering agent."),
        Message::user("List files."),
        Message::assistant("").with_reasoning("I should run ls.").with_tool_call("call_1", "Bash", args),
        Message::tool("call_1", "a.py\nb.py"),
    ];
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), json!(true));
    let got = t.render(&messages, Some(&[bash]), true, Some(&kwargs)).unwrap();
    let doc = std::fs::read_to_string(fixtures().join("qwen35_doc_example.txt")).unwrap();
    assert_eq!(got, doc);

    let plain = t.render(&[Message::user("Hi")], None, true, None).unwrap();
    assert_eq!(plain, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

#[test]
fn qwen35_loads_from_tokenizer_config_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures().join("qwen35/tokenizer_config.json"), dir.path().join("tokenizer_config.json")).unwrap();
    let from_config = ChatTemplate::from_model_dir(dir.path()).unwrap();
    assert_eq!(from_config.origin(), dir.path().join("tokenizer_config.json"));
    assert_eq!(from_config.eos_token(), Some("<|im_end|>"));
    assert_eq!(from_config.bos_token(), None);
    let from_jinja = ChatTemplate::from_model_dir(fixtures().join("qwen35")).unwrap();
    assert!(from_jinja.origin().ends_with("chat_template.jinja"));
    let msgs = [Message::system("s"), Message::user("u")];
    assert_eq!(
        from_config.render(&msgs, None, true, None).unwrap(),
        from_jinja.render(&msgs, None, true, None).unwrap()
    );
}

#[test]
fn openai_tool_call_arguments_string_is_parsed_into_parameters() {
    let t = ChatTemplate::from_model_dir(fixtures().join("qwen35")).unwrap();
    let raw = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "Bash", "arguments": "{\"command\": \"ls\", \"n\": 2}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x", "name": null}
    ]);
    let typed: Vec<Message> = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(typed[1].content, None);
    assert_eq!(typed[1].calls()[0].function.arguments, "{\"command\": \"ls\", \"n\": 2}");
    let out = t.render(&typed, None, false, None).unwrap();
    assert!(
        out.contains(
            "<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>"
        ),
        "{out}"
    );
    // The raw string form renders no parameters, exactly like transformers.
    let raw_out = t.render_json(raw.as_array().unwrap(), None, false, None).unwrap();
    assert!(raw_out.contains("<function=Bash>\n</function>"), "{raw_out}");

    // Arguments a client sent as an object render the same as the string form.
    let mut as_object = raw.clone();
    as_object[1]["tool_calls"][0]["function"]["arguments"] = json!({"command": "ls", "n": 2});
    let as_object: Vec<Message> = serde_json::from_value(as_object).unwrap();
    assert_eq!(t.render(&as_object, None, false, None).unwrap(), out);

    let bad = json!([{"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "[1]"}}]}]);
    let bad: Vec<Message> = serde_json::from_value(bad).unwrap();
    let err = t.render(&bad, None, false, None).unwrap_err().to_string();
    assert!(err.contains("message 1: arguments of x are not a JSON object"), "{err}");
}

#[test]
fn chatml_matches_transformers() {
    let t = ChatTemplate::from_model_dir(fixtures().join("chatml")).unwrap();
    assert_eq!(t.bos_token(), Some("<|im_start|>"));
    check_reference_renders(&t, "chatml_renders.json");
}

#[test]
fn simple_chatml_template_renders() {
    // SmolLM2-style ChatML, as a GGUF's tokenizer.chat_template carries it.
    let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let t = ChatTemplate::new(src, "smollm2.gguf").unwrap();
    let out =
        t.render(&[Message::user("Hi"), Message::assistant("Hello!"), Message::user("Bye")], None, true, None).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn named_templates_pick_tool_use_when_tools_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"eos_token": {"content": "</s>", "special": true}, "chat_template": [
        {"name": "default", "template": "D{{ messages|length }}{{ eos_token }}"},
        {"name": "tool_use", "template": "T{% for t in tools %}{{ t.function.name }}{% endfor %}"}]});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap();
    assert_eq!(t.names(), ["default", "tool_use"]);
    let msgs = [Message::user("x")];
    assert_eq!(t.render(&msgs, None, false, None).unwrap(), "D1</s>");
    let tools = [json!({"function": {"name": "a"}}), json!({"function": {"name": "b"}})];
    assert_eq!(t.render(&msgs, Some(&tools), false, None).unwrap(), "Tab");
    assert!(t.supports_tools(), "the tool_use template shows the tools");
}

#[test]
fn python_semantics_of_values_and_methods() {
    let src = "{{ flag }} {{ none }} {{ n }} {{ f }} {{ [1, 'a', none] }} {{ flag|string }} \
               {{ 'a,b'.split(',')[-1] }} {{ ' x '.strip() }} {{ 'abc'.startswith('ab') }} \
               {{ {'k': 'v'}|tojson }} {{ '<&>'|tojson }} {{ 'abc' is sequence }} {{ undefined_var }}|";
    let t = ChatTemplate::new(src, "inline").unwrap();
    let mut kw = Map::new();
    kw.insert("flag".into(), json!(true));
    kw.insert("none".into(), Value::Null);
    kw.insert("n".into(), json!(3));
    kw.insert("f".into(), json!(2.0));
    let out = t.render(&[Message::user("u")], None, false, Some(&kw)).unwrap();
    assert_eq!(out, "True None 3 2.0 [1, 'a', None] True b x True {\"k\": \"v\"} \"<&>\" True |");
}

#[test]
fn bad_inputs_are_clear_errors() {
    // missing directory / no template
    let dir = tempfile::tempdir().unwrap();
    match ChatTemplate::from_model_dir(dir.path()) {
        Err(ModelError::Format { path, msg }) => {
            assert_eq!(path, dir.path());
            assert!(msg.contains("no chat template"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // invalid JSON in tokenizer_config.json
    std::fs::write(dir.path().join("tokenizer_config.json"), "{\"chat_template\": ").unwrap();
    match ChatTemplate::from_model_dir(dir.path()) {
        Err(ModelError::Format { path, msg }) => {
            assert!(path.ends_with("tokenizer_config.json"));
            assert!(msg.contains("not valid JSON"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // template syntax error names the file and the line
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "ok\n{% for m in messages %}{{ m.content }\n").unwrap();
    match ChatTemplate::from_model_dir(dir.path()) {
        Err(e @ ModelError::Format { .. }) => {
            let text = e.to_string();
            assert!(text.contains("chat_template.jinja") && text.contains("does not compile"), "{text}");
            assert!(text.contains("line 2") || text.contains(":2"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // missing .jinja file
    match ChatTemplate::from_file(dir.path().join("nope.jinja")) {
        Err(ModelError::Io { path, .. }) => assert!(path.ends_with("nope.jinja")),
        other => panic!("{other:?}"),
    }
    // system message not first: the template's own message, naming the template
    let t = ChatTemplate::from_model_dir(fixtures().join("qwen35")).unwrap();
    let err = t.render(&[Message::user("Hi"), Message::system("late")], None, true, None).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("System message must be at the beginning.") && text.contains("chat_template.jinja"),
        "{text}"
    );
    // empty conversation, non-object message, reserved kwarg
    assert!(t.render(&[], None, true, None).unwrap_err().to_string().contains("empty conversation"));
    let err = t.render_json(&[json!("hi")], None, true, None).unwrap_err().to_string();
    assert!(err.contains("message 0 is not a JSON object"), "{err}");
    let mut kw = Map::new();
    kw.insert("messages".into(), json!([]));
    let err = t.render(&[Message::user("x")], None, true, Some(&kw)).unwrap_err().to_string();
    assert!(err.contains("`messages`"), "{err}");
}
