//! Which tool-call format a model writes, named (`--tool-parser NAME`) or detected from its
//! chat template's text.
//!
//! Detection looks for what the template writes around a call, in the order llama.cpp's
//! `common/chat.cpp` checks the same markers (read there, re-stated here):
//!
//! 1. `<tool_call>` together with `<function=` and `<parameter=`: Qwen XML (Qwen3.5,
//!    Qwen3-Coder, FrogNano);
//! 2. `<tool_call>`: Hermes JSON (Hermes 2/3 Pro, Qwen2.5, Qwen3);
//! 3. `[TOOL_CALLS]`: Mistral — with `[ARGS]` in the template, the `NAME[ARGS]{…}` style;
//! 4. `<|start_header_id|>ipython<|end_header_id|>` (the turn Llama 3.x gives tool results)
//!    or `<|python_tag|>`: Llama 3 JSON;
//! 5. `<|tool_call|>`: Granite's (and Phi-4-mini's) JSON list;
//! 6. anything else: Hermes JSON, the form most fine-tunes answer in and the one FrogNano
//!    describes tools in when a template has no tool support of its own.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::{
    CodecError, GraniteJson, HermesJson, Llama3Json, MistralJson, MistralStyle, QwenXml, ReplyParser, ToolCallFormat,
};
use crate::message::ToolCall;

/// A tool-call format by name: what `--tool-parser` takes and what detection picks. It is
/// itself a [`ToolCallFormat`] (the named one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParser {
    /// [`QwenXml`] (`qwen_xml`).
    QwenXml,
    /// [`HermesJson`] (`hermes`).
    Hermes,
    /// [`Llama3Json`] (`llama3_json`).
    Llama3Json,
    /// [`MistralJson`] (`mistral`) with the rendering style of the template.
    Mistral(MistralStyle),
    /// [`GraniteJson`] (`granite`): IBM Granite 3.x, Phi-4-mini.
    Granite,
}

/// A `--tool-parser` name that is not one of [`ToolParser::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tool parser {name:?}; the known ones are {}", ToolParser::NAMES.join(", "))]
pub struct UnknownToolParser {
    /// The name given.
    pub name: String,
}

impl ToolParser {
    /// Every name [`from_name`](Self::from_name) knows.
    pub const NAMES: [&'static str; 5] = ["qwen_xml", "hermes", "llama3_json", "mistral", "granite"];

    /// The format called `name` (one of [`NAMES`](Self::NAMES); `mistral` renders in the
    /// JSON-list style).
    pub fn from_name(name: &str) -> Result<Self, UnknownToolParser> {
        match name.trim() {
            "qwen_xml" => Ok(ToolParser::QwenXml),
            "hermes" => Ok(ToolParser::Hermes),
            "llama3_json" => Ok(ToolParser::Llama3Json),
            "mistral" => Ok(ToolParser::Mistral(MistralStyle::JsonList)),
            "granite" => Ok(ToolParser::Granite),
            other => Err(UnknownToolParser { name: other.to_string() }),
        }
    }

    /// The format a chat template's source writes its tool calls in (see the module docs).
    pub fn detect(template: &str) -> Self {
        let has = |s: &str| template.contains(s);
        if has("<tool_call>") && has("<function=") && has("<parameter=") {
            ToolParser::QwenXml
        } else if has("<tool_call>") {
            ToolParser::Hermes
        } else if has("[TOOL_CALLS]") {
            ToolParser::Mistral(if has("[ARGS]") { MistralStyle::ArgsTag } else { MistralStyle::JsonList })
        } else if has("<|start_header_id|>ipython<|end_header_id|>") || has("<|python_tag|>") {
            ToolParser::Llama3Json
        } else if has("<|tool_call|>") {
            ToolParser::Granite
        } else {
            ToolParser::Hermes
        }
    }

    /// The format a reply's own markers show, for text from a server that did not parse
    /// it: `[TOOL_CALLS]` Mistral, `<|python_tag|>` Llama 3, `<|tool_call|>` Granite,
    /// `<function=` Qwen XML, else
    /// Hermes (which also reads Qwen XML inside `<tool_call>` and JSON calls on their own).
    pub fn for_reply(text: &str) -> Self {
        if text.contains("[TOOL_CALLS]") {
            ToolParser::Mistral(MistralStyle::JsonList)
        } else if text.contains("<|python_tag|>") {
            ToolParser::Llama3Json
        } else if text.contains("<|tool_call|>") {
            ToolParser::Granite
        } else if text.contains("<function=") {
            ToolParser::QwenXml
        } else {
            ToolParser::Hermes
        }
    }

    /// The format itself.
    pub fn format(self) -> &'static dyn ToolCallFormat {
        match self {
            ToolParser::QwenXml => &QwenXml,
            ToolParser::Hermes => &HermesJson,
            ToolParser::Llama3Json => &Llama3Json,
            ToolParser::Mistral(MistralStyle::JsonList) => &MistralJson { style: MistralStyle::JsonList },
            ToolParser::Mistral(MistralStyle::ArgsTag) => &MistralJson { style: MistralStyle::ArgsTag },
            ToolParser::Granite => &GraniteJson,
        }
    }
}

/// The format a chat template's source writes its tool calls in, as a boxed format
/// ([`ToolParser::detect`]).
pub fn detect_format(template: &str) -> Box<dyn ToolCallFormat> {
    Box::new(ToolParser::detect(template))
}

impl ToolCallFormat for ToolParser {
    fn name(&self) -> &'static str {
        self.format().name()
    }

    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser> {
        self.format().stream_parser(thinking_prompted, tools)
    }

    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError> {
        self.format().render_tool_calls(calls)
    }

    fn content_separator(&self) -> &'static str {
        self.format().content_separator()
    }

    fn call_syntax(&self) -> &'static str {
        self.format().call_syntax()
    }
}

impl FromStr for ToolParser {
    type Err = UnknownToolParser;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s)
    }
}

impl fmt::Display for ToolParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for name in ToolParser::NAMES {
            let p = ToolParser::from_name(name).unwrap();
            assert_eq!(p.name(), name);
            assert_eq!(p.to_string().parse::<ToolParser>().unwrap(), p);
        }
        let err = ToolParser::from_name("xml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown tool parser \"xml\"; the known ones are qwen_xml, hermes, llama3_json, mistral, granite"
        );
    }

    #[test]
    fn detection_follows_the_template_markers() {
        let qwen35 = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>' }}";
        assert_eq!(ToolParser::detect(qwen35), ToolParser::QwenXml);
        let hermes = r#"{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}"#;
        assert_eq!(ToolParser::detect(hermes), ToolParser::Hermes);
        let nemo = r#"{{- "[TOOL_CALLS][" }}{%- for tool_call in tool_calls %}"#;
        assert_eq!(ToolParser::detect(nemo), ToolParser::Mistral(MistralStyle::JsonList));
        let small32 = r#"{{- "[TOOL_CALLS]" + tool.function.name + "[ARGS]" + arguments }}"#;
        assert_eq!(ToolParser::detect(small32), ToolParser::Mistral(MistralStyle::ArgsTag));
        let llama = "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}";
        assert_eq!(ToolParser::detect(llama), ToolParser::Llama3Json);
        let granite = "respond only with <|tool_call|> followed by a JSON list of tools used.";
        assert_eq!(ToolParser::detect(granite), ToolParser::Granite);
        assert_eq!(ToolParser::detect("{{ messages }}"), ToolParser::Hermes);
    }
}
