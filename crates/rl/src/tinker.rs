//! A client of SkyRL's Tinker-compatible training API (docs/rl.md §7): FrogNano keeps the
//! rollouts, rewards, masks and advantages, and sends the gradient work to a server that
//! runs it on GPUs (Ray + FSDP/Megatron), then pulls the new weights back for sampling.
//!
//! One step: `forward_backward` (the step's datums, split into bodies below the server's
//! size cap) → `optim_step` → `save_weights_for_sampler` → download the adapter archive.
//! Every call returns a future id, polled through `retrieve_future`. `seq_id` numbers the
//! calls per model so a restarted driver that resends a call is not applied twice.
//!
//! Starting the server as a Ray job (on a standing cluster, or as a KubeRay `RayJob` whose
//! `entrypoint` is the same command) is described in `docs/train.md`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::loss::{Datum, LossConfig, PolicyLoss};
use crate::optim::AdamWConfig;

/// Bodies are kept below this many bytes of JSON (the server caps a body at 64 MiB; the
/// Python SDK keeps chunks near 5 MB).
pub const MAX_BODY_BYTES: usize = 5 << 20;

/// The Tinker `Datum` of one training sequence. The aggregation's normaliser
/// ([`Datum::scale`]) is folded into the per-token advantage, so the result does not depend
/// on how the server reduces token losses, as long as it sums them (docs/rl.md §2).
pub fn datum_json(d: &Datum) -> Value {
    let adv: Vec<f32> = d.weights.iter().map(|&w| if w == 0.0 { 0.0 } else { d.advantage * d.scale }).collect();
    json!({
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": d.input}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": d.targets},
            "weights": {"data": d.weights},
            "logprobs": {"data": d.old_logprobs},
            "advantages": {"data": adv},
        }
    })
}

/// Splits datums into groups whose JSON stays under `max_bytes` (a single datum larger
/// than that gets a group of its own).
pub fn split_bodies(datums: Vec<Value>, max_bytes: usize) -> Vec<Vec<Value>> {
    let mut out: Vec<Vec<Value>> = Vec::new();
    let mut size = 0;
    for d in datums {
        let n = d.to_string().len();
        if out.is_empty() || size + n > max_bytes {
            out.push(Vec::new());
            size = 0;
        }
        size += n;
        out.last_mut().expect("pushed above").push(d);
    }
    out
}

/// The losses of the Tinker API itself, assumed when a server's capabilities do not list
/// any: Tinker's `get_server_capabilities` answers with the supported models only (SkyRL tx
/// 0.3.0 does so), and every Tinker server takes these loss names.
pub const TINKER_BUILTIN_LOSSES: [&str; 3] = ["cross_entropy", "importance_sampling", "ppo"];

/// The loss to request given the server's `supported_loss_fns` (the Tinker built-ins,
/// [`TINKER_BUILTIN_LOSSES`], when the server lists none): `ppo` with our clip range in ratio
/// space when offered, else `importance_sampling` (then keep rollouts at most one policy
/// version stale). `None` when the server offers neither.
pub fn choose_loss(capabilities: &Value, cfg: &LossConfig) -> Option<(String, Option<Value>)> {
    let offered: Vec<&str> = match capabilities.get("supported_loss_fns").and_then(Value::as_array) {
        Some(a) => a.iter().filter_map(Value::as_str).collect(),
        None => TINKER_BUILTIN_LOSSES.to_vec(),
    };
    if cfg.kind == PolicyLoss::Ppo && offered.contains(&"ppo") {
        let conf = json!({"clip_low_threshold": 1.0 - cfg.clip_low, "clip_high_threshold": 1.0 + cfg.clip_high});
        return Some(("ppo".into(), Some(conf)));
    }
    offered.contains(&"importance_sampling").then(|| ("importance_sampling".to_string(), None))
}

/// A session with one model on a Tinker-compatible server.
pub struct TinkerClient {
    base: String,
    agent: ureq::Agent,
    /// The server's session.
    pub session_id: String,
    /// The model being trained.
    pub model_id: String,
    /// Next `seq_id` (kept in the run's state so a restart continues the numbering).
    pub seq_id: u64,
    last_heartbeat: Instant,
}

impl TinkerClient {
    /// Connects to `url` (e.g. `http://head:8000`), checks health, opens a session and
    /// creates a LoRA model of `base_model` with `rank`.
    pub fn connect(url: &str, base_model: &str, rank: usize, seed: u64) -> anyhow::Result<TinkerClient> {
        let base = format!("{}/api/v1", url.trim_end_matches('/'));
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(330)).build();
        let mut c = TinkerClient {
            base,
            agent,
            session_id: String::new(),
            model_id: String::new(),
            seq_id: 0,
            last_heartbeat: Instant::now(),
        };
        c.get("healthz")?;
        let s = c.post("create_session", &json!({"tags": ["frognano"], "sdk_version": env!("CARGO_PKG_VERSION")}))?;
        c.session_id = field(&s, "session_id")?;
        let m = c.post(
            "create_model",
            &json!({"session_id": c.session_id, "base_model": base_model, "lora_config": {"rank": rank, "seed": seed}}),
        )?;
        if let Some(id) = m.get("request_id").and_then(Value::as_str) {
            let done = c.wait(id)?;
            c.model_id =
                m.get("model_id").and_then(Value::as_str).map(str::to_string).unwrap_or(field(&done, "model_id")?);
        } else {
            c.model_id = field(&m, "model_id")?;
        }
        Ok(c)
    }

    /// `get_server_capabilities`.
    pub fn capabilities(&mut self) -> anyhow::Result<Value> {
        self.get("get_server_capabilities")
    }

    /// Sends the step's datums (several bodies if needed) with `loss_fn`, then one
    /// `optim_step`; waits for both. Returns the forward-backward results and the optimizer
    /// result.
    pub fn train_step(
        &mut self,
        data: &[Datum],
        loss_fn: &str,
        loss_config: Option<&Value>,
        adam: &AdamWConfig,
    ) -> anyhow::Result<(Vec<Value>, Value)> {
        let bodies = split_bodies(data.iter().map(datum_json).collect(), MAX_BODY_BYTES);
        let mut results = Vec::new();
        for chunk in bodies {
            let mut input = json!({"data": chunk, "loss_fn": loss_fn});
            if let Some(c) = loss_config {
                input["loss_fn_config"] = c.clone();
            }
            let body = json!({"model_id": self.model_id, "forward_backward_input": input, "seq_id": self.seq_id});
            results.push(self.call_and_wait("forward_backward", &body)?);
        }
        let body = json!({
            "model_id": self.model_id,
            "adam_params": {"learning_rate": adam.lr, "beta1": adam.beta1, "beta2": adam.beta2, "eps": adam.eps, "weight_decay": adam.weight_decay},
            "seq_id": self.seq_id,
        });
        let opt = self.call_and_wait("optim_step", &body)?;
        Ok((results, opt))
    }

    /// `save_weights_for_sampler` under `name`; returns the `tinker://` path.
    pub fn save_for_sampler(&mut self, name: &str) -> anyhow::Result<String> {
        let body = json!({"model_id": self.model_id, "path": name, "seq_id": self.seq_id});
        let r = self.call_and_wait("save_weights_for_sampler", &body)?;
        Ok(r.get("path")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("tinker://{}/sampler_weights/{name}", self.model_id)))
    }

    /// `save_weights` (full training state, for resume) under `name`; returns the `tinker://`
    /// path that [`TinkerClient::load_weights`] takes.
    pub fn save_weights(&mut self, name: &str) -> anyhow::Result<String> {
        let body = json!({"model_id": self.model_id, "path": name, "seq_id": self.seq_id});
        let r = self.call_and_wait("save_weights", &body)?;
        Ok(r.get("path")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("tinker://{}/weights/{name}", self.model_id)))
    }

    /// `load_weights` from a `tinker://…/weights/…` path (resume).
    pub fn load_weights(&mut self, path: &str) -> anyhow::Result<()> {
        let body = json!({"model_id": self.model_id, "path": path, "seq_id": self.seq_id});
        self.call_and_wait("load_weights", &body)?;
        Ok(())
    }

    /// Downloads the archive of checkpoint `name` (a `.tar.gz`) to `dest`.
    pub fn download(&mut self, name: &str, dest: &std::path::Path) -> anyhow::Result<()> {
        let url = format!("{}/training_runs/{}/checkpoints/{name}/archive", self.base, self.model_id);
        let resp = self.agent.get(&url).call().map_err(|e| http_error(&url, e))?;
        let mut file =
            std::fs::File::create(dest).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dest.display()))?;
        std::io::copy(&mut resp.into_reader(), &mut file)
            .map_err(|e| anyhow::anyhow!("download of {url} into {} failed: {e}", dest.display()))?;
        Ok(())
    }

    fn call_and_wait(&mut self, endpoint: &str, body: &Value) -> anyhow::Result<Value> {
        self.heartbeat()?;
        let r = self.post(endpoint, body)?;
        self.seq_id += 1;
        match r.get("request_id").and_then(Value::as_str) {
            Some(id) => self.wait(id),
            None => Ok(r),
        }
    }

    /// Polls `retrieve_future` until the request is done (the server holds each poll up to
    /// 300 s and answers 408 when still running).
    fn wait(&mut self, request_id: &str) -> anyhow::Result<Value> {
        loop {
            let url = format!("{}/retrieve_future", self.base);
            match self.agent.post(&url).send_json(json!({"request_id": request_id})) {
                Ok(resp) => return resp.into_json::<Value>().map_err(|e| anyhow::anyhow!("{url}: bad JSON: {e}")),
                Err(ureq::Error::Status(408, _)) => {
                    self.heartbeat()?;
                    continue;
                }
                Err(e) => return Err(http_error(&url, e)),
            }
        }
    }

    fn heartbeat(&mut self) -> anyhow::Result<()> {
        if self.last_heartbeat.elapsed() >= Duration::from_secs(10) && !self.session_id.is_empty() {
            let body = json!({"session_id": self.session_id});
            self.post("session_heartbeat", &body)?;
            self.last_heartbeat = Instant::now();
        }
        Ok(())
    }

    fn get(&self, endpoint: &str) -> anyhow::Result<Value> {
        let url = format!("{}/{endpoint}", self.base);
        let resp = self.agent.get(&url).call().map_err(|e| http_error(&url, e))?;
        resp.into_json().map_err(|e| anyhow::anyhow!("{url}: bad JSON: {e}"))
    }

    fn post(&self, endpoint: &str, body: &Value) -> anyhow::Result<Value> {
        let url = format!("{}/{endpoint}", self.base);
        let resp = self.agent.post(&url).send_json(body).map_err(|e| http_error(&url, e))?;
        resp.into_json().map_err(|e| anyhow::anyhow!("{url}: bad JSON: {e}"))
    }
}

/// Unpacks a `.tar.gz` archive into `dest` (created).
pub fn unpack(archive: &std::path::Path, dest: &std::path::Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(archive).map_err(|e| anyhow::anyhow!("cannot open {}: {e}", archive.display()))?;
    std::fs::create_dir_all(dest).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dest.display()))?;
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(dest)
        .map_err(|e| anyhow::anyhow!("{} is not a readable .tar.gz archive: {e}", archive.display()))
}

/// The first file named `name` under `dir` (depth-first, sorted).
pub fn find_file(dir: &std::path::Path, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)
            .map_err(|e| anyhow::anyhow!("cannot list {}: {e}", d.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for p in entries.iter().rev() {
            if p.is_dir() {
                stack.push(p.clone());
            } else if p.file_name().is_some_and(|n| n == name) {
                return Ok(p.clone());
            }
        }
    }
    anyhow::bail!("no {name} inside {}", dir.display())
}

/// Adapter tensor names in PEFT's saved form (`base_model.model.` prefix, no adapter name),
/// whatever variant the server wrote (`…lora_A.default.weight`, no prefix).
pub fn peft_names(
    tensors: std::collections::HashMap<String, candle_core::Tensor>,
) -> std::collections::HashMap<String, candle_core::Tensor> {
    tensors
        .into_iter()
        .map(|(k, v)| {
            let k = k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.");
            let k = if k.starts_with("base_model.model.") { k } else { format!("base_model.model.{k}") };
            (k, v)
        })
        .collect()
}

fn field(v: &Value, key: &str) -> anyhow::Result<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("the Tinker server's answer has no {key:?}: {v}"))
}

fn http_error(url: &str, e: ureq::Error) -> anyhow::Error {
    match e {
        ureq::Error::Status(code, resp) => {
            let body = resp.into_string().unwrap_or_default();
            anyhow::anyhow!(
                "{url}: the Tinker server answered HTTP {code}: {}",
                body.chars().take(400).collect::<String>()
            )
        }
        ureq::Error::Transport(t) => anyhow::anyhow!("cannot reach the Tinker server at {url}: {t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datum(n: usize, a: f32, scale: f32) -> Datum {
        Datum {
            input: (0..n as u32).collect(),
            targets: (1..=n as u32).collect(),
            old_logprobs: vec![-0.5; n],
            trainer_logprobs: None,
            weights: (0..n).map(|i| (i % 2) as f32).collect(),
            advantage: a,
            group: 0,
            scale,
        }
    }

    #[test]
    fn datum_folds_the_normaliser_into_masked_advantages() {
        let v = datum_json(&datum(4, 0.5, 0.25));
        assert_eq!(v["model_input"]["chunks"][0]["type"], "encoded_text");
        assert_eq!(v["model_input"]["chunks"][0]["tokens"], json!([0, 1, 2, 3]));
        let f = &v["loss_fn_inputs"];
        assert_eq!(f["target_tokens"]["data"], json!([1, 2, 3, 4]));
        assert_eq!(f["weights"]["data"], json!([0.0, 1.0, 0.0, 1.0]));
        assert_eq!(f["advantages"]["data"], json!([0.0, 0.125, 0.0, 0.125]));
        // Every per-token array has the input's length.
        for k in ["target_tokens", "weights", "logprobs", "advantages"] {
            assert_eq!(f[k]["data"].as_array().unwrap().len(), 4, "{k}");
        }
    }

    #[test]
    fn bodies_stay_under_the_cap() {
        let ds: Vec<Value> = (0..50).map(|_| datum_json(&datum(2000, 1.0, 1.0))).collect();
        let one = ds[0].to_string().len();
        let bodies = split_bodies(ds, 10 * one + 10);
        assert_eq!(bodies.len(), 5);
        assert!(bodies.iter().all(|b| b.len() == 10));
        assert_eq!(split_bodies(vec![json!("x")], 0).len(), 1, "an oversized datum still goes, alone");
    }

    #[test]
    fn loss_choice_follows_the_server() {
        let cfg = LossConfig::default();
        let both = json!({"supported_loss_fns": ["cross_entropy", "importance_sampling", "ppo"]});
        let (name, conf) = choose_loss(&both, &cfg).unwrap();
        assert_eq!(name, "ppo");
        let conf = conf.unwrap();
        assert!((conf["clip_low_threshold"].as_f64().unwrap() - 0.8).abs() < 1e-6);
        assert!((conf["clip_high_threshold"].as_f64().unwrap() - 1.28).abs() < 1e-6);
        let is_only = json!({"supported_loss_fns": ["cross_entropy", "importance_sampling"]});
        assert_eq!(choose_loss(&is_only, &cfg).unwrap().0, "importance_sampling");
        assert!(choose_loss(&json!({"supported_loss_fns": ["cross_entropy"]}), &cfg).is_none());
        // A server that lists models only (Tinker's own answer) takes the built-in losses.
        let models_only = json!({"supported_models": [{"model_name": "m"}]});
        assert_eq!(choose_loss(&models_only, &cfg).unwrap().0, "ppo");
    }

    #[test]
    fn adapter_archives_unpack_and_names_normalise() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("src/sampler_weights/step-000001");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(inner.join("adapter_model.safetensors"), b"x").unwrap();
        let archive = dir.path().join("a.tar.gz");
        let gz = flate2::write::GzEncoder::new(std::fs::File::create(&archive).unwrap(), flate2::Compression::fast());
        let mut tb = tar::Builder::new(gz);
        tb.append_dir_all("ckpt", dir.path().join("src")).unwrap();
        tb.into_inner().unwrap().finish().unwrap();
        let out = dir.path().join("out");
        unpack(&archive, &out).unwrap();
        let found = find_file(&out, "adapter_model.safetensors").unwrap();
        assert!(found.ends_with("ckpt/sampler_weights/step-000001/adapter_model.safetensors"), "{found:?}");
        assert!(find_file(&out, "nope.bin").unwrap_err().to_string().contains("no nope.bin inside"));
        std::fs::write(dir.path().join("bad.tar.gz"), b"not gzip").unwrap();
        assert!(unpack(&dir.path().join("bad.tar.gz"), &out).unwrap_err().to_string().contains("not a readable"));

        let t = candle_core::Tensor::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let names: std::collections::HashMap<_, _> = [
            ("model.layers.0.self_attn.q_proj.lora_A.default.weight".to_string(), t.clone()),
            ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight".to_string(), t),
        ]
        .into_iter()
        .collect();
        let mut keys: Vec<String> = peft_names(names).into_keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            vec![
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
            ]
        );
    }

    #[test]
    fn unreachable_server_is_a_clear_error() {
        let err = TinkerClient::connect("http://127.0.0.1:9", "Qwen/Qwen3.5-4B", 32, 0).err().unwrap().to_string();
        assert!(err.contains("cannot reach the Tinker server at http://127.0.0.1:9/api/v1/healthz"), "{err}");
    }
}
