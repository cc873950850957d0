//! Conversations of a model on the device saved to disk and restored by a later process (on
//! the simulator): the restored state goes on exactly as the live one, from a session file
//! (`chat --session`) and from a store (`serve --session-dir`).

use std::ops::ControlFlow;
use std::sync::Arc;

use frognano_engine::persist::{load_session_file, save_session_file};
use frognano_engine::{GenerateRequest, Generation, Session, SessionStore};
use frognano_gpu::GpuModel;
use frognano_model::CausalLm;

fn on_device(name: &str) -> Arc<dyn CausalLm> {
    let path = frognano_gpu::fixtures_dir().join(name);
    let cpu = frognano_model::load::load_on_cpu(path.to_str().unwrap(), None, false).unwrap();
    Arc::new(GpuModel::from_cpu(&frognano_gpu::test_device(), &*cpu.model).unwrap())
}

fn ids(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 131 + salt * 17) % 1000 + 3) as u32).collect()
}

fn run(s: &mut Session, prompt: &[u32], n: usize) -> Generation {
    s.generate(prompt, &GenerateRequest::greedy(n), |_| ControlFlow::Continue(())).unwrap()
}

fn tokens_and_bits(g: &Generation) -> Vec<(u32, u32)> {
    g.tokens.iter().map(|t| (t.id, t.logprob.to_bits())).collect()
}

#[test]
fn a_session_file_of_a_device_model_restores_its_state() {
    for name in ["qwen35-tiny", "arch/qwen2-tiny.gguf"] {
        let m = on_device(name);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.fnstate");
        let mut live = Session::new(m.clone());
        let prompt = ids(30, 4);
        let g = run(&mut live, &prompt, 4);
        save_session_file(&path, "m", &live, serde_json::json!({})).unwrap();
        let (mut back, _) = load_session_file(&path, "m", &m).unwrap();
        assert_eq!(back.tokens(), live.tokens(), "{name}");
        assert!(back.cache().is_on_device(), "{name}: the state went back to the device");
        let next = [prompt, g.tokens.iter().map(|t| t.id).collect(), ids(5, 5)].concat();
        let (a, b) = (run(&mut back, &next, 5), run(&mut live, &next, 5));
        assert_eq!(tokens_and_bits(&a), tokens_and_bits(&b), "{name}: the restored state is the state");
        assert_eq!(a.cached_tokens, b.cached_tokens, "{name}: nothing is prefilled again");
    }
}

#[test]
fn a_store_of_a_device_model_resumes_after_a_restart() {
    let m = on_device("qwen35-tiny");
    let dir = tempfile::tempdir().unwrap();
    let prompt = ids(40, 1);
    let mut live = Session::new(m.clone());
    let first = run(&mut live, &prompt, 5);
    {
        let store = SessionStore::open(dir.path(), "m", m.as_ref(), 1 << 30).unwrap();
        store.save(&live);
        store.flush();
        // A device cache's earlier snapshots stay on the device: its current state is saved.
        assert_eq!(store.stats().files, 1);
    }
    let saved = live.tokens().len();
    let next: Vec<u32> = [prompt, first.tokens.iter().map(|t| t.id).collect(), ids(8, 2)].concat();
    let store = SessionStore::open(dir.path(), "m", m.as_ref(), 1 << 30).unwrap();
    let (mut restored, kept) = store.restore(&next, 0, &m).expect("the next turn extends the saved one");
    assert_eq!(kept, saved);
    let want = run(&mut live.fork(saved).unwrap(), &next, 6);
    let got = run(&mut restored, &next, 6);
    assert_eq!(tokens_and_bits(&got), tokens_and_bits(&want));
}
