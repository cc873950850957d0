//! Grammar-constrained decoding on the real demo model (SmolLM2-135M-Instruct): a reply
//! made under a JSON schema always parses and validates, at temperature 1 over several
//! seeds, while the same seeds without the constraint mostly do not; tool calls forced by a
//! grammar always parse into a call of the named tool.

use std::sync::Arc;

use frognano_engine::tool_grammar::{tool_call_grammar, CallRule};
use frognano_engine::{
    ChatParts, CompiledGrammar, ConstraintFactory, FinishReason, GenerateRequest, Generation, Grammar, SamplingParams,
    Scheduler, SchedulerConfig,
};
use frognano_protocol::codec::{QwenXml, ToolCallFormat};
use frognano_protocol::Message;
use serde_json::{json, Value};

const SEEDS: u64 = 8;

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "color": {"enum": ["red", "green", "blue"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}
        },
        "required": ["name", "color", "age"],
        "additionalProperties": false
    })
}

/// Whether `text` is a JSON object valid under [`person_schema`] (checked by hand, field by
/// field, so the check does not share code with what is tested).
fn valid_person(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["age", "color", "name"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = obj["name"].as_str().ok_or("name is not a string")?;
    if name.chars().count() > 24 {
        return Err(format!("name {name:?} is longer than 24"));
    }
    if !matches!(obj["color"].as_str(), Some("red" | "green" | "blue")) {
        return Err(format!("color {}", obj["color"]));
    }
    match obj["age"].as_i64() {
        Some(0..=120) => Ok(()),
        _ => Err(format!("age {}", obj["age"])),
    }
}

struct Demo {
    scheduler: Arc<Scheduler>,
    chat: ChatParts,
    factory: ConstraintFactory,
}

fn demo() -> Option<Demo> {
    let path = frognano_testkit::demo_model()?;
    let (model, chat) = ChatParts::split(frognano_model::load(path.to_str().unwrap()).unwrap()).unwrap();
    let factory = ConstraintFactory::new(Arc::clone(&chat.tokenizer), model.vocab_size(), &chat.eos_ids).unwrap();
    let config = SchedulerConfig { max_batch: 2 * SEEDS as usize, sessions: 2 * SEEDS as usize, ..Default::default() };
    Some(Demo { scheduler: Arc::new(Scheduler::start(model, config).unwrap()), chat, factory })
}

impl Demo {
    fn prompt(&self, messages: &[Message], tools: &[Value]) -> Vec<u32> {
        let tools = (!tools.is_empty()).then_some(tools);
        let text = self.chat.template.render(messages, tools, true, None).unwrap();
        self.chat.tokenizer.encode_with(&text, false).unwrap()
    }

    /// One reply per seed, all decoded together on the scheduler; `grammar` constrains each.
    fn replies(&self, prompt: &[u32], grammar: Option<&CompiledGrammar>, max_tokens: usize) -> Vec<Generation> {
        let handles: Vec<_> = (0..SEEDS)
            .map(|seed| {
                let scheduler = Arc::clone(&self.scheduler);
                let req = GenerateRequest {
                    sampling: SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() },
                    max_tokens,
                    stop_ids: self.chat.eos_ids.clone(),
                    top_logprobs: 0,
                    checkpoint: None,
                };
                let prompt = prompt.to_vec();
                let constraint = grammar.map(CompiledGrammar::start);
                std::thread::spawn(move || {
                    scheduler.generate_constrained(prompt, req, constraint, |_| std::ops::ControlFlow::Continue(()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    }

    fn text(&self, g: &Generation) -> String {
        let ids: Vec<u32> = g.tokens.iter().map(|t| t.id).filter(|id| !self.chat.eos_ids.contains(id)).collect();
        self.chat.tokenizer.decode(&ids, true).unwrap()
    }
}

#[test]
fn schema_constrained_replies_always_validate_and_unconstrained_ones_mostly_do_not() {
    let Some(demo) = demo() else { return };
    let messages = [
        Message::system("You are a helpful assistant."),
        Message::user("Invent a person. Answer in JSON with their name, favourite color and age."),
    ];
    let prompt = demo.prompt(&messages, &[]);
    let grammar = demo.factory.compile(&Grammar::JsonSchema(person_schema())).unwrap();
    let constrained = demo.replies(&prompt, Some(&grammar), 120);
    for (seed, g) in constrained.iter().enumerate() {
        let text = demo.text(g);
        assert_eq!(g.finish, FinishReason::Stop, "seed {seed}: the reply should end with the grammar: {text:?}");
        if let Err(e) = valid_person(&text) {
            panic!("seed {seed}: the constrained reply {text:?} is not valid: {e}");
        }
        let stats = g.constraint.as_ref().expect("constraint stats");
        assert!(stats.error.is_none(), "seed {seed}: {stats:?}");
        assert!(stats.masks >= g.tokens.len().saturating_sub(1), "one mask per sampled token: {stats:?}");
    }
    let free = demo.replies(&prompt, None, 120);
    let valid_free = free.iter().filter(|g| valid_person(&demo.text(g)).is_ok()).count();
    // Without the grammar the model writes prose, markdown fences, other keys or types:
    // the constraint is what makes the replies valid.
    assert!(
        valid_free * 2 < SEEDS as usize,
        "{valid_free} of {SEEDS} unconstrained replies were valid; the test no longer shows the constraint matters: {:?}",
        free.iter().map(|g| demo.text(g)).collect::<Vec<_>>()
    );
    assert!(free.iter().all(|g| g.constraint.is_none()));
}

/// A named tool forced by the Qwen XML grammar: every seed's reply parses (through the
/// codec the agent and server use) into exactly one call of that tool, with the schema's
/// required argument and enum value.
#[test]
fn a_forced_tool_call_always_parses_into_that_tool() {
    let Some(demo) = demo() else { return };
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}),
        json!({"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}}}),
    ];
    let messages = [Message::user("What is the weather in Paris?")];
    let prompt = demo.prompt(&messages, &tools);
    let g = tool_call_grammar(QwenXml.name(), &tools, &CallRule::Named("get_weather".into()), false).unwrap();
    let grammar = demo.factory.compile(&g).unwrap();
    for (seed, g) in demo.replies(&prompt, Some(&grammar), 120).iter().enumerate() {
        let text = demo.text(g);
        assert_eq!(g.finish, FinishReason::Stop, "seed {seed}: {text:?}");
        let reply = QwenXml.parse_reply(&text, false, &tools);
        assert!(reply.malformed.is_empty(), "seed {seed}: malformed calls {:?} in {text:?}", reply.malformed);
        assert_eq!(reply.tool_calls.len(), 1, "seed {seed}: {text:?}");
        let call = &reply.tool_calls[0];
        assert_eq!(call.function.name, "get_weather");
        let args: Value = serde_json::from_str(&call.function.arguments).unwrap();
        assert!(args["city"].is_string(), "seed {seed}: {args}");
        assert!(matches!(args["unit"].as_str(), Some("celsius" | "fahrenheit")), "seed {seed}: {args}");
    }
}
