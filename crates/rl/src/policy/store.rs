//! The policy's weights: base tensors under their Hugging Face names (trainable [`Var`]s in
//! full fine-tuning, frozen tensors under LoRA) and the LoRA adapters on linear modules.

use std::collections::HashMap;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, Var};
use frognano_model::weights::{Elementwise, WeightSpec};
use rand::{Rng, SeedableRng};

use super::ops;

/// A weight tensor under [`Elementwise`], so [`frognano_model::weights::Role::to_model`] turns
/// stored values into what the network multiplies by exactly as the inference model does.
struct Stored(Tensor);

impl Elementwise for Stored {
    type Error = candle_core::Error;
    fn plus_one(self) -> Result<Self> {
        Ok(Stored((self.0 + 1.0)?))
    }
    fn neg_exp(self) -> Result<Self> {
        Ok(Stored(self.0.exp()?.neg()?))
    }
}

/// A base weight: trainable or frozen.
pub(crate) enum Slot {
    /// Full fine-tuning: the optimizer updates it.
    Trainable(Var),
    /// Under LoRA: fixed.
    Frozen(Tensor),
}

impl Slot {
    fn tensor(&self) -> &Tensor {
        match self {
            Slot::Trainable(v) => v.as_tensor(),
            Slot::Frozen(t) => t,
        }
    }
}

/// One LoRA adapter `W + (alpha/r)·B·A` on the linear module `module` (canonical name, e.g.
/// `model.layers.0.self_attn.q_proj`).
pub(crate) struct Adapter {
    pub module: String,
    /// `[r, in]`.
    pub a: Var,
    /// `[out, r]`, zero at start.
    pub b: Var,
}

/// All weights of one policy.
pub(crate) struct Store {
    /// Canonical names (`model.…`, `lm_head.weight`) in load order.
    pub names: Vec<String>,
    slots: HashMap<String, Slot>,
    /// LoRA adapters in module order.
    pub adapters: Vec<Adapter>,
    adapter_of: HashMap<String, usize>,
    /// `alpha / r`.
    pub lora_scale: f64,
    /// Storage dtype of every weight.
    pub storage: DType,
    /// Dtype the forward pass computes in (f64 for f64 storage, else f32).
    pub compute: DType,
}

/// The dtype computations run in for a storage dtype.
pub(crate) fn compute_dtype(storage: DType) -> DType {
    if storage == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl Store {
    /// A store over `tensors` (canonical name → tensor, in order), converted to `storage`.
    /// All base weights are trainable unless `frozen`.
    pub fn new(tensors: Vec<(String, Tensor)>, storage: DType, frozen: bool) -> Result<Self> {
        let mut names = Vec::with_capacity(tensors.len());
        let mut slots = HashMap::with_capacity(tensors.len());
        for (name, t) in tensors {
            let t = t.to_dtype(storage)?;
            let slot = if frozen { Slot::Frozen(t) } else { Slot::Trainable(Var::from_tensor(&t)?) };
            names.push(name.clone());
            slots.insert(name, slot);
        }
        Ok(Store {
            names,
            slots,
            adapters: Vec::new(),
            adapter_of: HashMap::new(),
            lora_scale: 1.0,
            storage,
            compute: compute_dtype(storage),
        })
    }

    /// True when a base weight of that canonical name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.slots.contains_key(name)
    }

    fn slot(&self, name: &str) -> Result<&Slot> {
        self.slots.get(name).ok_or_else(|| candle_core::Error::Msg(format!("policy has no weight `{name}`")))
    }

    /// The weight `name` in the compute dtype (differentiable when trainable).
    pub fn get(&self, name: &str) -> Result<Tensor> {
        self.slot(name)?.tensor().to_dtype(self.compute)
    }

    /// The weight `w` as the network uses it (compute dtype, differentiable): its role's
    /// conversion of the stored values (`1 + w` for zero-centred norms, `−exp(A_log)`).
    pub fn model_form(&self, w: &WeightSpec) -> Result<Tensor> {
        Ok(w.role.to_model(Stored(self.get(&w.name)?))?.0)
    }

    /// The weight `name` as stored (storage dtype).
    pub fn stored(&self, name: &str) -> Result<&Tensor> {
        Ok(self.slot(name)?.tensor())
    }

    /// The trainable base weights, in order (empty under LoRA).
    pub fn trainable(&self) -> Vec<(String, Var)> {
        self.names
            .iter()
            .filter_map(|n| match &self.slots[n] {
                Slot::Trainable(v) => Some((n.clone(), v.clone())),
                Slot::Frozen(_) => None,
            })
            .collect()
    }

    /// `x · Wᵀ` for the weight `name` (`[out, in]`) and `x` `[n, in]`. A frozen weight goes
    /// through [`FrozenLinear`], whose backward pass computes only the input gradient (candle's
    /// matmul would also compute the unused weight gradient, as costly as the forward).
    pub fn matmul_weight(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        match self.slot(name)? {
            Slot::Trainable(_) => ops::linear(x, &self.get(name)?),
            Slot::Frozen(_) => x.contiguous()?.apply_op1(FrozenLinear { w: self.get(name)?.detach() }),
        }
    }

    /// `x · (W + s·B·A)ᵀ` for the linear module `module` (weight `module.weight`).
    pub fn linear(&self, x: &Tensor, module: &str) -> Result<Tensor> {
        let y = self.matmul_weight(x, &format!("{module}.weight"))?;
        match self.adapter_of.get(module) {
            None => Ok(y),
            Some(&i) => {
                let ad = &self.adapters[i];
                let a = ad.a.as_tensor().to_dtype(self.compute)?;
                let b = ad.b.as_tensor().to_dtype(self.compute)?;
                y + (ops::linear(&ops::linear(x, &a)?, &b)? * self.lora_scale)?
            }
        }
    }

    /// The weight `name` with its LoRA adapter (if any) merged in, in the compute dtype,
    /// detached from the graph.
    pub fn merged(&self, name: &str) -> Result<Tensor> {
        let w = self.get(name)?.detach();
        let module = name.strip_suffix(".weight").unwrap_or(name);
        match self.adapter_of.get(module) {
            Some(&i) if name.ends_with(".weight") => {
                let ad = &self.adapters[i];
                let ba = ad.b.as_tensor().to_dtype(self.compute)?.matmul(&ad.a.as_tensor().to_dtype(self.compute)?)?;
                w + (ba.detach() * self.lora_scale)?
            }
            _ => Ok(w),
        }
    }

    /// Puts LoRA adapters of rank `rank` on every module of `modules` (canonical names of
    /// linear modules), stored in the compute dtype; `A` is Kaiming-uniform like PEFT's default (bound `1/√in`), drawn from
    /// `seed`; `B` is zero, so the adapted model starts equal to the base.
    pub fn add_lora(&mut self, modules: &[String], rank: usize, alpha: f32, seed: u64) -> Result<()> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x4c6f5241);
        self.lora_scale = alpha as f64 / rank as f64;
        for m in modules {
            let w = self.stored(&format!("{m}.weight"))?;
            let (out, inp) = w.dims2()?;
            let bound = 1.0 / (inp as f32).sqrt();
            let a: Vec<f32> = (0..rank * inp).map(|_| rng.random_range(-bound..bound)).collect();
            // Adapters live in the compute dtype (f32 for a bf16 base) so optimizer steps on them
            // are not lost to bf16 rounding.
            let a = Tensor::from_vec(a, (rank, inp), w.device())?.to_dtype(self.compute)?;
            let b = Tensor::zeros((out, rank), self.compute, w.device())?;
            self.adapter_of.insert(m.clone(), self.adapters.len());
            self.adapters.push(Adapter { module: m.clone(), a: Var::from_tensor(&a)?, b: Var::from_tensor(&b)? });
        }
        Ok(())
    }
}

/// `x · Wᵀ` with a constant `W`: the backward pass returns only `∂/∂x = grad · W`.
struct FrozenLinear {
    /// `[out, in]`, compute dtype, detached.
    w: Tensor,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = ops::storage_tensor(storage, layout, self.name(), "input")?;
        ops::tensor_storage(x.matmul(&self.w.t()?)?, self.name())
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.w)?))
    }
}
