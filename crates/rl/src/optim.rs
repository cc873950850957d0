//! AdamW with global-norm gradient clipping, and its state as named tensors so a resumed run
//! continues exactly where it stopped.

use std::collections::HashMap;

use candle_core::{DType, Result as CandleResult, Tensor, Var};
use serde::{Deserialize, Serialize};

/// Optimizer settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this value (`None` = no clipping).
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 1e-6, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, max_grad_norm: Some(1.0) }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Whether clipping scaled the gradients down.
    pub clipped: bool,
}

/// AdamW over a fixed, ordered list of parameters. Moments are kept in f32 whatever the
/// parameters' dtype, and so is a master copy of every parameter stored in lower precision:
/// a bf16 weight cannot take updates smaller than its rounding step, the f32 master can.
pub struct AdamW {
    /// Settings.
    pub cfg: AdamWConfig,
    step: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    master: Vec<Option<Tensor>>,
}

impl AdamW {
    /// A fresh optimizer for `params`.
    pub fn new(cfg: AdamWConfig, params: &[(String, Var)]) -> CandleResult<Self> {
        let zeros = |p: &Var| Tensor::zeros(p.shape(), DType::F32, p.device());
        let m = params.iter().map(|(_, p)| zeros(p)).collect::<CandleResult<Vec<_>>>()?;
        let v = params.iter().map(|(_, p)| zeros(p)).collect::<CandleResult<Vec<_>>>()?;
        let master = params
            .iter()
            .map(|(_, p)| (p.dtype() != DType::F32).then(|| p.as_tensor().to_dtype(DType::F32)).transpose())
            .collect::<CandleResult<Vec<_>>>()?;
        Ok(AdamW { cfg, step: 0, m, v, master })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Global L2 norm of `grads`.
    pub fn global_norm(grads: &[Tensor]) -> CandleResult<f64> {
        let mut sq = 0f64;
        for g in grads {
            sq += g.to_dtype(DType::F32)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
        Ok(sq.sqrt())
    }

    /// One update of `params` with `grads` (same order and shapes).
    pub fn step(&mut self, params: &[(String, Var)], grads: &[Tensor]) -> CandleResult<StepStats> {
        assert_eq!(params.len(), grads.len(), "one gradient per parameter");
        let grad_norm = Self::global_norm(grads)?;
        let clip = match self.cfg.max_grad_norm {
            Some(max) if grad_norm > max && grad_norm.is_finite() => max / (grad_norm + 1e-6),
            _ => 1.0,
        };
        self.step += 1;
        let c = &self.cfg;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        for (i, ((_, p), g)) in params.iter().zip(grads).enumerate() {
            let g = (g.to_dtype(DType::F32)? * clip)?;
            let m = ((&self.m[i] * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
            let v = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let update = ((&m / bc1)? / ((&v / bc2)?.sqrt()? + c.eps)?)?;
            let w = match &self.master[i] {
                Some(master) => master.clone(),
                None => p.as_tensor().to_dtype(DType::F32)?,
            };
            let w = ((&w * (1.0 - c.lr * c.weight_decay))? - (update * c.lr)?)?;
            p.set(&w.to_dtype(p.dtype())?)?;
            if self.master[i].is_some() {
                self.master[i] = Some(w);
            }
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(StepStats { grad_norm, clipped: clip < 1.0 })
    }

    /// The state as named tensors (`adam.m.<param>`, `adam.v.<param>`, `adam.step`).
    pub fn state(&self, params: &[(String, Var)]) -> CandleResult<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (i, (name, _)) in params.iter().enumerate() {
            out.insert(format!("adam.m.{name}"), self.m[i].clone());
            out.insert(format!("adam.v.{name}"), self.v[i].clone());
            if let Some(master) = &self.master[i] {
                out.insert(format!("adam.master.{name}"), master.clone());
            }
        }
        // u64 does not fit a tensor exactly in every dtype; two u32 halves do.
        let step = [(self.step >> 32) as u32, self.step as u32];
        out.insert("adam.step".into(), Tensor::from_slice(&step, 2, &candle_core::Device::Cpu)?);
        Ok(out)
    }

    /// Restores [`AdamW::state`]; an error names the missing or mis-shaped tensor.
    pub fn load_state(&mut self, params: &[(String, Var)], state: &HashMap<String, Tensor>) -> anyhow::Result<()> {
        let get = |key: &str, shape: &candle_core::Shape| -> anyhow::Result<Tensor> {
            let t = state.get(key).ok_or_else(|| anyhow::anyhow!("optimizer state: tensor {key} is missing"))?;
            anyhow::ensure!(
                t.shape() == shape,
                "optimizer state: tensor {key} has shape {:?}, expected {:?}",
                t.dims(),
                shape.dims()
            );
            Ok(t.to_dtype(DType::F32)?)
        };
        for (i, (name, p)) in params.iter().enumerate() {
            self.m[i] = get(&format!("adam.m.{name}"), p.shape())?;
            self.v[i] = get(&format!("adam.v.{name}"), p.shape())?;
            if self.master[i].is_some() {
                self.master[i] = Some(get(&format!("adam.master.{name}"), p.shape())?);
            }
        }
        let step =
            state.get("adam.step").ok_or_else(|| anyhow::anyhow!("optimizer state: tensor adam.step is missing"))?;
        let step: Vec<u32> = step.to_dtype(DType::U32)?.to_vec1()?;
        anyhow::ensure!(step.len() == 2, "optimizer state: adam.step has {} values, expected 2", step.len());
        self.step = ((step[0] as u64) << 32) | step[1] as u64;
        Ok(())
    }
}

/// Gradients of several backward passes summed per parameter (a mini-batch run one sequence
/// at a time, so memory stays one sequence deep), in the order of `params`.
pub struct GradSum<'p> {
    params: &'p [(String, Var)],
    acc: Vec<Option<Tensor>>,
}

impl<'p> GradSum<'p> {
    /// Nothing summed yet, for `params`.
    pub fn new(params: &'p [(String, Var)]) -> Self {
        GradSum { params, acc: vec![None; params.len()] }
    }

    /// Adds one backward pass's gradients (a parameter it did not reach adds nothing).
    pub fn add(&mut self, grads: &candle_core::backprop::GradStore) -> CandleResult<()> {
        for (slot, (_, p)) in self.acc.iter_mut().zip(self.params) {
            if let Some(g) = grads.get(p.as_tensor()) {
                *slot = Some(match slot.take() {
                    Some(a) => (a + g)?,
                    None => g.clone(),
                });
            }
        }
        Ok(())
    }

    /// The sums, zeros for a parameter no pass reached: what [`AdamW::step`] takes.
    pub fn into_grads(self) -> CandleResult<Vec<Tensor>> {
        self.acc
            .into_iter()
            .zip(self.params)
            .map(|(g, (_, p))| g.map_or_else(|| p.as_tensor().zeros_like(), Ok))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn first_step_moves_each_weight_by_lr_against_the_gradient_sign() {
        // With bias correction, step 1 of Adam is lr·g/(|g|+eps) = ±lr.
        let p = Var::from_slice(&[1.0f32, -2.0, 3.0], 3, &Device::Cpu).unwrap();
        let params = vec![("w".to_string(), p.clone())];
        let cfg = AdamWConfig { lr: 0.1, max_grad_norm: None, ..AdamWConfig::default() };
        let mut opt = AdamW::new(cfg, &params).unwrap();
        let g = Tensor::from_slice(&[0.5f32, -4.0, 0.0], 3, &Device::Cpu).unwrap();
        opt.step(&params, &[g]).unwrap();
        let w: Vec<f32> = p.as_tensor().to_vec1().unwrap();
        assert!((w[0] - 0.9).abs() < 1e-6 && (w[1] + 1.9).abs() < 1e-6 && (w[2] - 3.0).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn clipping_and_weight_decay() {
        let p = Var::from_slice(&[1.0f32, 1.0], 2, &Device::Cpu).unwrap();
        let params = vec![("w".to_string(), p.clone())];
        let cfg = AdamWConfig { lr: 0.0, weight_decay: 0.0, max_grad_norm: Some(1.0), ..AdamWConfig::default() };
        let mut opt = AdamW::new(cfg, &params).unwrap();
        let s = opt.step(&params, &[Tensor::from_slice(&[3.0f32, 4.0], 2, &Device::Cpu).unwrap()]).unwrap();
        assert!((s.grad_norm - 5.0).abs() < 1e-6 && s.clipped);
        // m after one step = (1−β1)·g·(1/5).
        let st = opt.state(&params).unwrap();
        let m: Vec<f32> = st["adam.m.w"].to_vec1().unwrap();
        assert!((m[0] - 0.1 * 0.6).abs() < 1e-6 && (m[1] - 0.1 * 0.8).abs() < 1e-6, "{m:?}");

        let p2 = Var::from_slice(&[2.0f32], 1, &Device::Cpu).unwrap();
        let params2 = vec![("w".to_string(), p2.clone())];
        let mut decay =
            AdamW::new(AdamWConfig { lr: 0.5, weight_decay: 0.1, ..AdamWConfig::default() }, &params2).unwrap();
        decay.step(&params2, &[Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap()]).unwrap();
        // Zero gradient: only the decay acts, w ← w·(1 − lr·wd).
        assert!((p2.as_tensor().to_vec1::<f32>().unwrap()[0] - 1.9).abs() < 1e-6);
    }

    #[test]
    fn state_round_trip_continues_identically() {
        let dev = Device::Cpu;
        let run = |resume_after: Option<usize>| -> Vec<f32> {
            let p = Var::from_slice(&[0.3f32, -0.7, 1.1], 3, &dev).unwrap();
            let params = vec![("w".to_string(), p.clone())];
            let cfg = AdamWConfig { lr: 0.05, weight_decay: 0.01, ..AdamWConfig::default() };
            let mut opt = AdamW::new(cfg, &params).unwrap();
            for i in 0..6 {
                if Some(i) == resume_after {
                    let st = opt.state(&params).unwrap();
                    let mut fresh = AdamW::new(cfg, &params).unwrap();
                    fresh.load_state(&params, &st).unwrap();
                    opt = fresh;
                }
                let w = p.as_tensor().to_vec1::<f32>().unwrap();
                let g: Vec<f32> = w.iter().map(|x| 2.0 * x + i as f32 * 0.1).collect();
                opt.step(&params, &[Tensor::from_slice(&g, 3, &dev).unwrap()]).unwrap();
            }
            p.as_tensor().to_vec1().unwrap()
        };
        assert_eq!(run(None), run(Some(3)));
    }

    #[test]
    fn bf16_weights_take_updates_below_their_rounding_step() {
        // At 1.0, bf16 steps by 2^-7; 100 Adam steps of 1e-4 move the f32 master by 0.01.
        let p = Var::from_tensor(&Tensor::ones(1, DType::BF16, &Device::Cpu).unwrap()).unwrap();
        let params = vec![("w".to_string(), p.clone())];
        let cfg = AdamWConfig { lr: 1e-4, max_grad_norm: None, ..AdamWConfig::default() };
        let mut opt = AdamW::new(cfg, &params).unwrap();
        let g = Tensor::ones(1, DType::BF16, &Device::Cpu).unwrap();
        for _ in 0..100 {
            opt.step(&params, std::slice::from_ref(&g)).unwrap();
        }
        let w = p.as_tensor().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()[0];
        assert!((w - 0.99).abs() < 0.004, "bf16 weight stuck at {w}");
        let st = opt.state(&params).unwrap();
        let master = st["adam.master.w"].to_vec1::<f32>().unwrap()[0];
        assert!((master - 0.99).abs() < 1e-4, "master {master}");
    }

    #[test]
    fn missing_state_is_named() {
        let p = Var::from_slice(&[1.0f32], 1, &Device::Cpu).unwrap();
        let params = vec![("layer.w".to_string(), p)];
        let mut opt = AdamW::new(AdamWConfig::default(), &params).unwrap();
        let err = opt.load_state(&params, &HashMap::new()).unwrap_err().to_string();
        assert!(err.contains("adam.m.layer.w"), "{err}");
    }
}
