//! Chat templates and tool-call formats, on real templates: the format each template is
//! detected as, that the format's renderer writes calls exactly as the template does, and
//! that a template without tool support (SmolLM2's) gets the tools described in the Hermes
//! form instead of dropped.
//!
//! Templates: Qwen2.5-Coder-1.5B-Instruct's (from its GGUF, committed as
//! fixtures/tokenizer/qwen25-coder/chat_template.jinja and checked against the GGUF when it is
//! on disk), SmolLM2-135M-Instruct's (read from the demo model's GGUF), the Qwen3.5 one of the
//! tokenizer fixtures, and small Llama 3.1 and Mistral templates written here with the parts
//! of Meta's and Mistral's templates that write tool calls.

use std::path::{Path, PathBuf};

use frognano_model::chat::ChatTemplate;
use frognano_model::gguf::GgufFile;
use frognano_model::gguf_load::chat_template_from_gguf;
use frognano_protocol::codec::{MistralStyle, ToolCallFormat, ToolParser};
use frognano_protocol::{Message, ToolCall};
use serde_json::{json, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(rel: &str) -> PathBuf {
    root().join("fixtures/tokenizer").join(rel)
}

fn tools() -> Vec<Value> {
    vec![json!({"type": "function", "function": {"name": "Read", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}})]
}

fn call(id: &str, name: &str, args: Value) -> ToolCall {
    ToolCall { id: id.into(), ..ToolCall::new(name, args.to_string()) }
}

/// A tool round: user, the assistant's calls (with `content`), their results, and the next
/// user turn.
fn tool_round(content: Option<&str>, calls: Vec<ToolCall>) -> Vec<Message> {
    let mut out = vec![Message::user("Read hello.txt and a.txt.")];
    let ids: Vec<String> = calls.iter().map(|c| c.id.clone()).collect();
    out.push(Message::assistant_reply(content.map(str::to_string), None, calls));
    for (i, id) in ids.iter().enumerate() {
        out.push(Message::tool(id.clone(), format!("1. line {i}")));
    }
    out.push(Message::user("Thanks."));
    out
}

/// The rendering of `messages` contains what `format` renders for the assistant turn.
fn assert_renders_calls_as(template: &ChatTemplate, format: ToolParser, content: Option<&str>, calls: Vec<ToolCall>) {
    let messages = tool_round(content, calls.clone());
    let text = template.render(&messages, Some(&tools()), false, None).unwrap();
    let turn = format.render_assistant_content(content.unwrap_or(""), &calls).unwrap();
    assert!(text.contains(&turn), "{format}: the template does not write\n{turn}\nin\n{text}");
    // And what the template wrote parses back to the same calls.
    let parsed = format.parse_reply(&turn, false, &tools());
    let names: Vec<&str> = parsed.tool_calls.iter().map(|c| c.function.name.as_str()).collect();
    assert_eq!(names, calls.iter().map(|c| c.function.name.as_str()).collect::<Vec<_>>());
    assert_eq!(parsed.content, content.unwrap_or(""));
}

#[test]
fn qwen25_coder_template_is_hermes_and_the_renderer_writes_what_it_writes() {
    let t = ChatTemplate::from_file(fixture("qwen25-coder/chat_template.jinja")).unwrap();
    assert!(t.supports_tools());
    assert_eq!(t.tool_parser(), ToolParser::Hermes);
    let calls = vec![
        call("call_a", "Read", json!({"file_path": "hello.txt", "limit": 2, "deep": {"x": [1, true, null]}})),
        call("call_b", "Read", json!({"file_path": "a.txt"})),
    ];
    assert_renders_calls_as(&t, ToolParser::Hermes, Some("Reading both."), calls.clone());
    assert_renders_calls_as(&t, ToolParser::Hermes, None, calls);
    assert!(!t.injects_tool_prompt(&tool_round(None, vec![]), Some(&tools())));

    // The committed template is the one in the GGUF, when the model is on disk.
    let gguf = root().join("models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf");
    if gguf.exists() {
        let f = GgufFile::open(&gguf).unwrap();
        let from_gguf = chat_template_from_gguf(&f).unwrap().expect("the GGUF has a chat template");
        assert_eq!(from_gguf.tool_source(), t.tool_source());
        assert_eq!(from_gguf.tool_parser(), ToolParser::Hermes);
    } else {
        eprintln!("note: {} is not on disk; checked the committed copy of its template only", gguf.display());
    }
}

#[test]
fn qwen35_template_is_qwen_xml_and_the_renderer_writes_what_it_writes() {
    let t = ChatTemplate::from_file(fixture("qwen35/chat_template.jinja")).unwrap();
    assert!(t.supports_tools());
    assert_eq!(t.tool_parser(), ToolParser::QwenXml);
    let calls = vec![
        call("call_a", "Read", json!({"file_path": "hello.txt", "limit": 2})),
        call("call_b", "Read", json!({"file_path": "a.txt"})),
    ];
    assert_renders_calls_as(&t, ToolParser::QwenXml, Some("Reading both."), calls.clone());
    assert_renders_calls_as(&t, ToolParser::QwenXml, None, calls);
}

/// The demo model's GGUF, or `None` (a visible skip; a failure under
/// FROGNANO_REQUIRE_FIXTURES, as in CI).
fn demo_gguf() -> Option<PathBuf> {
    frognano_model::test_support::demo_model("SmolLM2 template tests")
}

#[test]
fn smollm2_template_gets_the_tools_described_in_the_hermes_form() {
    let Some(path) = demo_gguf() else { return };
    let t = chat_template_from_gguf(&GgufFile::open(&path).unwrap()).unwrap().expect("SmolLM2 has a chat template");
    assert!(!t.supports_tools(), "SmolLM2's template ignores tools");
    assert_eq!(ToolParser::detect(t.tool_source()), ToolParser::Hermes);
    assert_eq!(t.tool_parser(), ToolParser::Hermes);

    // Tools and a system message: the block is merged into it.
    let msgs = [Message::system("You are terse."), Message::user("Read hello.txt.")];
    assert!(t.injects_tool_prompt(&msgs, Some(&tools())));
    let text = t.render(&msgs, Some(&tools()), true, None).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are terse.\n\n# Tools\n"), "{text}");
    assert!(text.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"Read\""), "{text}");
    assert!(
        text.contains("within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>"),
        "{text}"
    );
    assert!(
        text.ends_with("<|im_end|>\n<|im_start|>user\nRead hello.txt.<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    // Without a system message the block is the system message (not SmolLM's default).
    let text = t.render(&msgs[1..], Some(&tools()), true, None).unwrap();
    assert!(text.starts_with("<|im_start|>system\n# Tools\n"), "{text}");
    assert!(!text.contains("named SmolLM"));
    // The same conversation without tools renders exactly as before.
    assert!(!t.injects_tool_prompt(&msgs, None));
    assert_eq!(
        t.render(&msgs[1..], None, true, None).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nRead hello.txt.<|im_end|>\n<|im_start|>assistant\n"
    );

    // A tool round (the assistant turn has no content, as clients send it): calls and results
    // are written into the turns instead of failing on the missing content.
    let round = tool_round(None, vec![call("call_a", "Read", json!({"file_path": "hello.txt"}))]);
    let text = t.render(&round, Some(&tools()), true, None).unwrap();
    assert!(
        text.contains(
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}\n\
             </tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1. line 0\n</tool_response><|im_end|>\n\
             <|im_start|>user\nThanks.<|im_end|>\n"
        ),
        "{text}"
    );
    // transformers' own rendering (render_json) is left as transformers does it: the tools
    // are dropped.
    let plain = t.render_json(&[json!({"role": "user", "content": "x"})], Some(&tools()), true, None).unwrap();
    assert!(!plain.contains("Read"));
}

/// The parts of Meta's Llama 3.1 template that show tools, write calls and return results.
const LLAMA31: &str = r#"{{- bos_token }}
{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n\nYou have access to the following functions:\n\n' }}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}
{%- for message in messages %}
{%- if message.tool_calls %}
{%- if message.tool_calls|length != 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}
{%- elif message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}{{- message.content }}{{- "<|eot_id|>" }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"#;

#[test]
fn llama31_template_is_llama3_json() {
    let t = ChatTemplate::new(LLAMA31, "llama31.jinja").unwrap();
    assert!(t.supports_tools());
    assert_eq!(t.tool_parser(), ToolParser::Llama3Json);
    let calls = vec![call("call_a", "Read", json!({"file_path": "hello.txt", "n": [1, 2.5]}))];
    assert_renders_calls_as(&t, ToolParser::Llama3Json, None, calls);
}

/// The parts of Mistral Nemo's template (JSON list with 9-character ids).
const MISTRAL_NEMO: &str = r#"{%- for message in messages %}
{%- if message.role == "user" %}
{%- if tools and loop.last %}{{- "[AVAILABLE_TOOLS][" }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- "][/AVAILABLE_TOOLS]" }}{%- endif %}
{{- "[INST]" + message.content + "[/INST]" }}
{%- elif message.tool_calls is defined %}
{{- "[TOOL_CALLS][" }}
{%- for tool_call in message.tool_calls %}
{%- set out = tool_call.function|tojson %}
{{- out[:-1] }}
{%- if not tool_call.id is defined or tool_call.id|length != 9 %}{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{%- endif %}
{{- ', "id": "' + tool_call.id + '"}' }}
{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
{%- endfor %}
{%- elif message.role == "tool" %}
{{- '[TOOL_RESULTS]{"content": ' + message.content|tojson + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}"#;

/// The parts of Mistral Small 3.2's template (`NAME[ARGS]{…}`).
const MISTRAL_SMALL: &str = r#"{%- for message in messages %}
{%- if message.role == "user" %}
{%- if tools and loop.last %}{{- "[AVAILABLE_TOOLS]" + tools|tojson + "[/AVAILABLE_TOOLS]" }}{%- endif %}
{{- "[INST]" + message.content + "[/INST]" }}
{%- elif message.role == "assistant" %}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for tool in message.tool_calls %}
{%- set arguments = tool.function.arguments %}
{%- if arguments is not string %}{%- set arguments = arguments|tojson %}{%- endif %}
{{- "[TOOL_CALLS]" + tool.function.name + "[ARGS]" + arguments }}
{%- endfor %}
{{- eos_token }}
{%- elif message.role == "tool" %}
{{- "[TOOL_RESULTS]" + message.content|string + "[/TOOL_RESULTS]" }}
{%- endif %}
{%- endfor %}"#;

#[test]
fn mistral_templates_are_mistral_in_their_own_style() {
    let nemo = ChatTemplate::new(MISTRAL_NEMO, "nemo.jinja").unwrap().with_special_token("eos_token", "</s>");
    assert!(nemo.supports_tools());
    let parser = nemo.tool_parser();
    assert_eq!(parser, ToolParser::Mistral(MistralStyle::JsonList));
    let calls = vec![
        call("abcDEF123", "Read", json!({"file_path": "hello.txt"})),
        call("xyz987ABC", "Read", json!({"file_path": "a"})),
    ];
    assert_renders_calls_as(&nemo, parser, None, calls.clone());

    let small = ChatTemplate::new(MISTRAL_SMALL, "small.jinja").unwrap().with_special_token("eos_token", "</s>");
    let parser = small.tool_parser();
    assert_eq!(parser, ToolParser::Mistral(MistralStyle::ArgsTag));
    assert_renders_calls_as(&small, parser, Some("Reading both."), calls);
}
