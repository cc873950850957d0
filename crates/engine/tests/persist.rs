//! Conversation states on disk: a state saved by one process and restored by the next goes
//! on exactly as the live session would have, on the hybrid model (recurrent state) and on an
//! attention-only one, within the store's byte budget, and never from another model's or a
//! damaged file.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use frognano_engine::persist::{load_session_file, save_session_file};
use frognano_engine::{GenerateRequest, Generation, SamplingParams, Scheduler, SchedulerConfig, Session, SessionStore};
use frognano_model::qwen35::Qwen35;
use frognano_model::{CausalLm, KvType};

fn hybrid() -> Arc<dyn CausalLm> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    Arc::new(Qwen35::from_safetensors(&dir).unwrap())
}

/// The demo model (llama architecture, keys and values only) with its cache in `kv`.
fn rewindable(kv: KvType) -> Option<Arc<dyn CausalLm>> {
    let path = frognano_testkit::demo_model()?;
    let mut model = frognano_model::load::load(path.to_str().unwrap()).unwrap().model;
    model.set_kv_type(kv).unwrap();
    Some(Arc::from(model))
}

fn greedy(n: usize) -> GenerateRequest {
    GenerateRequest::greedy(n)
}

fn sampled(n: usize, seed: u64) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() },
        ..greedy(n)
    }
}

fn ids(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 131 + salt * 17) % 1000 + 3) as u32).collect()
}

fn run(s: &mut Session, prompt: &[u32], req: &GenerateRequest) -> Generation {
    s.generate(prompt, req, |_| ControlFlow::Continue(())).unwrap()
}

fn token_ids(g: &Generation) -> Vec<u32> {
    g.tokens.iter().map(|t| t.id).collect()
}

/// Same tokens, and the same log-probabilities to the bit: the restored state is the state.
fn assert_identical(a: &Generation, b: &Generation, what: &str) {
    assert_eq!(token_ids(a), token_ids(b), "{what}: tokens");
    let bits = |g: &Generation| g.tokens.iter().map(|t| t.logprob.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(a), bits(b), "{what}: log-probabilities");
}

const BIG: u64 = 1 << 34;

/// Turn 1 runs live and is saved; "the process restarts" (the store is closed and opened
/// again); turn 2 (the reply, then a new message) and a retry of turn 1's prompt with another
/// message restore from disk and give what the live session gives.
fn a_restored_conversation_goes_on_as_the_live_one(m: Arc<dyn CausalLm>, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let prompt1 = ids(60, 1);
    let mut live = Session::new(m.clone());
    let first = run(&mut live, &prompt1, &greedy(6));
    {
        let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap();
        store.save(&live);
        store.flush();
        assert_eq!(store.stats().files, 2, "{what}: the prompt's end and the reply's end are saved");
    }
    let saved_end = live.tokens().len();
    let prompt2: Vec<u32> = [prompt1.clone(), token_ids(&first), ids(20, 2)].concat();
    let prompt3: Vec<u32> = [prompt1.clone(), ids(10, 3)].concat();

    let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap();
    assert_eq!(store.stats().files, 2, "{what}: the files are found again after the restart");
    let (mut restored, kept) = store.restore(&prompt2, 0, &m).expect("turn 2 extends the saved reply");
    assert_eq!(kept, saved_end, "{what}: the whole saved conversation is reused");
    let got = run(&mut restored, &prompt2, &sampled(8, 7));
    let want = run(&mut live.fork(saved_end).unwrap(), &prompt2, &sampled(8, 7));
    assert_identical(&got, &want, &format!("{what}: turn 2"));
    assert_eq!(got.cached_tokens, saved_end, "{what}: the restored tokens count as cached");

    let (mut retry, kept) = store.restore(&prompt3, 0, &m).expect("the retry extends the saved prompt");
    assert!(kept >= prompt1.len(), "{what}: the retry reuses at least turn 1's prompt ({kept})");
    let got = run(&mut retry, &prompt3, &greedy(8));
    let want = run(&mut live, &prompt3, &greedy(8));
    assert_identical(&got, &want, &format!("{what}: a retry of turn 1"));

    // Nothing is restored where memory already holds as much.
    assert!(store.restore(&prompt2, prompt2.len(), &m).is_none());
}

#[test]
fn a_restored_conversation_on_the_hybrid_model_goes_on_as_the_live_one() {
    a_restored_conversation_goes_on_as_the_live_one(hybrid(), "qwen35 tiny");
}

#[test]
fn a_restored_conversation_on_an_attention_model_goes_on_as_the_live_one() {
    for kv in [KvType::F16, KvType::Q8_0] {
        let Some(m) = rewindable(kv) else { return };
        a_restored_conversation_goes_on_as_the_live_one(m, &format!("demo model, {kv} cache"));
    }
}

fn dir_bytes(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
        .collect();
    files.sort();
    files
}

#[test]
fn later_turns_write_only_their_new_keys_and_values() {
    let Some(m) = rewindable(KvType::F16) else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap();
    let mut s = Session::new(m.clone());
    let long = ids(400, 1);
    let first = run(&mut s, &long, &greedy(4));
    store.save(&s);
    store.flush();
    let after_one: u64 = dir_bytes(dir.path()).iter().map(|f| f.1).sum();
    let next: Vec<u32> = [long.clone(), token_ids(&first), ids(30, 2)].concat();
    run(&mut s, &next, &greedy(4));
    store.save(&s);
    store.flush();
    let files = dir_bytes(dir.path());
    let added: u64 = files.iter().map(|f| f.1).sum::<u64>() - after_one;
    assert_eq!(files.len(), 4);
    // 400 tokens' keys and values went into turn 1's files; turn 2's hold its ~34 new rows
    // and two logits rows, far less than the 434-token history.
    assert!(added * 3 < after_one, "turn 2 wrote {added} bytes, turn 1 {after_one}: it should only add its rows");
    // And the chain restores the whole history.
    let (_, kept) = store.restore(&[s.tokens().to_vec(), vec![5]].concat(), 0, &m).unwrap();
    assert_eq!(kept, s.tokens().len());
}

#[test]
fn the_budget_keeps_the_most_recent_conversation() {
    let m = hybrid();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (ids(50, 1), ids(50, 2));
    let mut sa = Session::new(m.clone());
    run(&mut sa, &a, &greedy(3));
    // One conversation's two files fit; two conversations' four do not.
    let one = {
        let probe = tempfile::tempdir().unwrap();
        let store = SessionStore::open(probe.path(), "model-a", m.as_ref(), BIG).unwrap();
        store.save(&sa);
        store.flush();
        store.stats().bytes
    };
    let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), one + one / 2).unwrap();
    store.save(&sa);
    store.flush();
    let mut sb = Session::new(m.clone());
    run(&mut sb, &b, &greedy(3));
    store.save(&sb);
    store.flush();
    let st = store.stats();
    assert!(st.bytes <= st.budget, "{st:?}");
    assert!(store.restore(&[b.clone(), vec![9]].concat(), 0, &m).is_some(), "the newest conversation is kept");
    assert!(store.restore(&[a.clone(), vec![9]].concat(), 0, &m).is_none(), "the oldest went first");
}

#[test]
fn another_models_states_and_damaged_files_are_never_loaded() {
    let m = hybrid();
    let dir = tempfile::tempdir().unwrap();
    let prompt = ids(40, 1);
    let mut s = Session::new(m.clone());
    run(&mut s, &prompt, &greedy(3));
    {
        let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap();
        store.save(&s);
        store.flush();
    }
    let next = [s.tokens().to_vec(), vec![11, 12]].concat();
    let other = SessionStore::open(dir.path(), "model-b", m.as_ref(), 1).unwrap();
    assert_eq!(other.stats().files, 0, "model-b does not see model-a's states");
    assert!(other.restore(&next, 0, &m).is_none());
    drop(other);
    assert_eq!(dir_bytes(dir.path()).len(), 2, "and does not delete them, even over its budget");

    // One flipped byte in the largest file's data: that file is refused and dropped, and the
    // prompt falls back to the other saved point (the prompt's end).
    let (name, _) = dir_bytes(dir.path()).into_iter().max_by_key(|f| f.1).unwrap();
    let path = dir.path().join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[200] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap();
    let restored = store.restore(&next, 0, &m);
    assert!(restored.is_none_or(|(_, kept)| kept == prompt.len()), "only the undamaged point may be used");
}

#[test]
fn a_session_file_keeps_the_state_and_the_callers_data() {
    let m = hybrid();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.fnstate");
    let mut s = Session::new(m.clone());
    let prompt = ids(30, 4);
    let g = run(&mut s, &prompt, &greedy(4));
    save_session_file(&path, "model-a", &s, serde_json::json!({"messages": ["hi"]})).unwrap();
    let (mut back, extra) = load_session_file(&path, "model-a", &m).unwrap();
    assert_eq!(extra["messages"][0], "hi");
    assert_eq!(back.tokens(), s.tokens());
    let next = [prompt, token_ids(&g), ids(5, 5)].concat();
    assert_identical(&run(&mut back, &next, &greedy(5)), &run(&mut s, &next, &greedy(5)), "session file");
    let e = load_session_file(&path, "model-b", &m).err().unwrap().to_string();
    assert!(e.contains("chat.fnstate") && e.contains("model-b"), "{e}");
}

#[test]
fn a_scheduler_with_a_store_resumes_a_conversation_after_a_restart() {
    let m = hybrid();
    let dir = tempfile::tempdir().unwrap();
    let prompt1 = ids(80, 6);
    let config = |store: &Arc<SessionStore>| SchedulerConfig { store: Some(Arc::clone(store)), ..Default::default() };
    let generate = |sch: &Scheduler, p: &[u32], req: GenerateRequest| {
        sch.generate(p.to_vec(), req, |_| ControlFlow::Continue(())).unwrap()
    };
    let first = {
        let store = Arc::new(SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap());
        let sch = Scheduler::start(m.clone(), config(&store)).unwrap();
        let g = generate(&sch, &prompt1, greedy(5));
        drop(sch);
        store.flush();
        g
    };
    let prompt2: Vec<u32> = [prompt1.clone(), token_ids(&first), ids(25, 7)].concat();
    let store = Arc::new(SessionStore::open(dir.path(), "model-a", m.as_ref(), BIG).unwrap());
    let sch = Scheduler::start(m.clone(), config(&store)).unwrap();
    let got = generate(&sch, &prompt2, sampled(6, 3));
    assert_eq!(sch.stats().restored.load(Ordering::Relaxed), 1);
    assert!(got.cached_tokens >= prompt1.len() + 4, "the first turn came from disk ({} cached)", got.cached_tokens);
    let mut live = Session::new(m.clone());
    run(&mut live, &prompt1, &greedy(5));
    assert_identical(&got, &run(&mut live, &prompt2, &sampled(6, 3)), "after the restart");
}

#[test]
fn a_long_conversation_stays_within_the_budget_and_its_latest_turn_restores() {
    // Every turn's file holds a recurrent state; the files others continue are stripped to
    // their keys and values when the budget runs short, so twelve turns (24 files) fit in far
    // less than their whole size, and the latest turn still restores exactly.
    let m = hybrid();
    let dir = tempfile::tempdir().unwrap();
    let mut live = Session::new(m.clone());
    let mut prompt = ids(30, 1);
    let g = run(&mut live, &prompt, &greedy(3));
    let probe = tempfile::tempdir().unwrap();
    let one_file = {
        let store = SessionStore::open(probe.path(), "model-a", m.as_ref(), BIG).unwrap();
        store.save(&live);
        store.flush();
        store.stats().bytes / 2
    };
    let store = SessionStore::open(dir.path(), "model-a", m.as_ref(), 8 * one_file).unwrap();
    store.save(&live);
    let mut last = g;
    for turn in 0..11 {
        prompt = [prompt, token_ids(&last), ids(8, turn + 2)].concat();
        last = run(&mut live, &prompt, &greedy(3));
        store.save(&live);
    }
    store.flush();
    let st = store.stats();
    let whole: u64 = 12 * 2 * one_file;
    assert!(st.bytes <= st.budget && st.budget < whole, "{st:?}, whole {whole}");
    assert_eq!(st.files, 24, "no file was deleted: the early ones were stripped, the chain holds");
    let next = [prompt.clone(), token_ids(&last), ids(6, 40)].concat();
    let (mut restored, kept) = store.restore(&next, 0, &m).expect("the latest turn restores");
    assert_eq!(kept, live.tokens().len());
    let want = run(&mut live, &next, &greedy(4));
    assert_identical(&run(&mut restored, &next, &greedy(4)), &want, "after stripping");
    // A stripped point is no longer a place to start from.
    assert!(store.restore(&[ids(30, 1), vec![7]].concat(), 0, &m).is_none());
}

#[test]
fn a_flipped_byte_in_the_attention_rows_is_named_by_its_section() {
    // The attention rows are checked while they are copied (in pieces of 256 KiB, layers in
    // parallel): a damaged byte in a later piece still fails the load and names the section.
    // 2,500 positions of 128-byte rows (2 KV heads × 32, f16) span two pieces.
    let m = hybrid();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.fnstate");
    let mut s = Session::new(m.clone());
    run(&mut s, &ids(2500, 7), &greedy(2));
    save_session_file(&path, "model-a", &s, serde_json::Value::Null).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let (at, len) = (word(8), word(16));
    let header: serde_json::Value = serde_json::from_slice(&bytes[at..at + len]).unwrap();
    let section = header["sections"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|s| s["name"].as_str().unwrap().starts_with('v'))
        .expect("the hybrid model has attention layers")
        .clone();
    let (name, offset, n) = (
        section["name"].as_str().unwrap(),
        section["offset"].as_u64().unwrap() as usize,
        section["len"].as_u64().unwrap() as usize,
    );
    assert!(n > 256 << 10, "{name}: {n} bytes, one piece only");
    bytes[offset + n - 3] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let e = load_session_file(&path, "model-a", &m).err().expect("a damaged file is refused").to_string();
    assert!(e.contains(&format!("section {name} is damaged")) && e.contains("chat.fnstate"), "{e}");
}
