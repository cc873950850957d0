//! The multi-token-prediction (MTP) head of Qwen3.5 checkpoints (`mtp.*`), the drafter of
//! `--speculative mtp` (docs/speculative.md, "MTP drafting").
//!
//! For a position i whose main-model hidden state `h_i` (after the final norm) is known and
//! the token `x_{i+1}` after it, the head predicts `x_{i+2}`:
//!
//! ```text
//! e = RMSNorm_emb(embed(x_{i+1}))          (zero-centred scale, 1 + w)
//! g = RMSNorm_hid(h_i)                     (zero-centred scale, 1 + w)
//! u = fc([e ; g])                          fc: [d, 2d], the embedding half first
//! u = DecoderLayer(u)                      one gated full-attention layer + SwiGLU MLP, at
//!                                          position i, with a KV cache of its own
//! o = RMSNorm_mtp(u)                       (zero-centred)
//! logits = lm_head(o)                      the main model's head (tied: the embedding)
//! ```
//!
//! A second draft feeds `o` back as the hidden state, with the first draft as the token, at
//! position i + 1. The layer's attention and RoPE are the main model's (same shapes and
//! `rope_theta`), so the stack's [`Qwen35::run_layer`] runs it.

use crate::cache::{Cache, LayerCache};
use crate::config::{LayerType, Qwen35Config};
use crate::decoder::{self, LayerStack, Rows};
use crate::error::{ModelError, Result};
use crate::kernels::rms_norm;
use crate::qwen35::{load_layer, Layer, LayerMap, Qwen35, Segment};
use crate::tensor::Matrix;
use crate::weights::{Role, TensorSource, WeightSpec};
use crate::{CausalLm, MtpHead};

/// Hugging Face name of the MTP head's input projection.
pub const MTP_FC: &str = "mtp.fc.weight";

/// Every weight of the MTP head: Hugging Face name, shape and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qwen35MtpMap {
    /// `[d]`, zero-centred: the norm of the next token's embedding.
    pub pre_fc_norm_embedding: WeightSpec,
    /// `[d]`, zero-centred: the norm of the main model's hidden state.
    pub pre_fc_norm_hidden: WeightSpec,
    /// `[d, 2d]`: the projection of `[embedding ; hidden]`.
    pub fc: WeightSpec,
    /// The head's one full-attention decoder layer (`mtp.layers.0.*`).
    pub layer: LayerMap,
    /// `[d]`, zero-centred: the norm before the shared output head.
    pub norm: WeightSpec,
}

impl Qwen35MtpMap {
    /// The map for `cfg`.
    pub fn new(cfg: &Qwen35Config) -> Self {
        let d = cfg.hidden_size;
        Qwen35MtpMap {
            pre_fc_norm_embedding: WeightSpec::new("mtp.pre_fc_norm_embedding.weight", [d], Role::ZeroCentredNorm),
            pre_fc_norm_hidden: WeightSpec::new("mtp.pre_fc_norm_hidden.weight", [d], Role::ZeroCentredNorm),
            fc: WeightSpec::new(MTP_FC, [d, 2 * d], Role::Linear),
            layer: LayerMap::new(cfg, LayerType::Full, |suffix| format!("mtp.layers.0.{suffix}")),
            norm: WeightSpec::new("mtp.norm.weight", [d], Role::ZeroCentredNorm),
        }
    }

    /// Every weight, in checkpoint order.
    pub fn specs(&self) -> Vec<&WeightSpec> {
        let mut v = vec![&self.fc];
        v.extend(self.layer.specs());
        v.extend([&self.norm, &self.pre_fc_norm_embedding, &self.pre_fc_norm_hidden]);
        v
    }
}

/// The loaded MTP head (norm scales held as `1 + w`).
#[derive(Debug, Clone)]
pub struct Qwen35Mtp {
    /// Embedding norm scale, `[d]`.
    pub pre_fc_norm_embedding: Vec<f32>,
    /// Hidden-state norm scale, `[d]`.
    pub pre_fc_norm_hidden: Vec<f32>,
    /// `[d, 2d]`.
    pub fc: Matrix,
    /// The full-attention decoder layer.
    pub layer: Layer,
    /// Output norm scale, `[d]`.
    pub norm: Vec<f32>,
}

impl Qwen35Mtp {
    /// Loads the head when `src` has one: `mtp.fc.weight` and the layer's query projection
    /// both present (a checkpoint with a stray `mtp.*` tensor or two has none). Any other
    /// tensor of the head missing is then an error naming it; so is a second MTP layer, which
    /// no Qwen3.5 checkpoint has and whose use the published code leaves open, and so are
    /// embeddings of the head's own.
    pub fn load(cfg: &Qwen35Config, src: &dyn TensorSource, key_head: &[usize]) -> Result<Option<Self>> {
        let map = Qwen35MtpMap::new(cfg);
        let q = match &map.layer.mixer {
            crate::qwen35::MixerMap::Attention(a) => &a.q_proj.name,
            crate::qwen35::MixerMap::DeltaNet(_) => unreachable!("the MTP layer is a full-attention layer"),
        };
        if !src.contains(MTP_FC) || !src.contains(q) {
            return Ok(None);
        }
        if src.contains("mtp.embed_tokens.weight") {
            // `mtp_use_dedicated_embeddings`: the head would read its own embedding table.
            return Err(ModelError::format(
                src.origin(),
                "the MTP head has embeddings of its own (mtp.embed_tokens.weight); only a head sharing the \
                 model's embedding is supported",
            ));
        }
        if src.contains("mtp.layers.1.input_layernorm.weight") {
            return Err(ModelError::format(
                src.origin(),
                "the MTP head has more than one layer (mtp.layers.1.*); only one is supported",
            ));
        }
        Ok(Some(Qwen35Mtp {
            pre_fc_norm_embedding: src.vector(&map.pre_fc_norm_embedding)?,
            pre_fc_norm_hidden: src.vector(&map.pre_fc_norm_hidden)?,
            fc: src.matrix(&map.fc)?,
            layer: load_layer(src, &map.layer, key_head)?,
            norm: src.vector(&map.norm)?,
        }))
    }

    /// The head's projection matrices.
    pub(crate) fn matrices(&self) -> Vec<&Matrix> {
        let mut v = vec![&self.fc];
        v.extend(self.layer.matrices());
        v
    }

    /// The head's projection matrices, to re-quantize or repack.
    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v = vec![&mut self.fc];
        v.extend(self.layer.matrices_mut());
        v
    }
}

impl MtpHead for Qwen35 {
    fn new_mtp_cache(&self) -> Cache {
        let c = &self.cfg;
        Cache::new(vec![LayerCache::attention(self.kv_type(), c.num_key_value_heads, c.head_dim)])
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn forward_with_hidden(&self, ids: &[u32], cache: &mut Cache, stepwise: bool) -> Result<(Vec<f32>, Vec<f32>)> {
        crate::check_ids(ids, self.vocab_size())?;
        if !self.fits(cache) {
            return Err(ModelError::Input("cache belongs to a different model".into()));
        }
        let (t, d) = (ids.len(), self.cfg.hidden_size);
        crate::kernels::on_pool(|| {
            let rows = if stepwise { Rows::Stepwise } else { Rows::Prompt };
            let h = self.decode_layers(ids, &mut [(t, cache)], rows);
            // Row-wise norm: the last row's bits are those `forward` computes from it alone.
            let hidden = self.final_norm(&h);
            let logits = if stepwise { self.head(&hidden, t) } else { self.head(&hidden[(t - 1) * d..], 1) };
            Ok((logits, hidden))
        })
    }

    fn forward_batch_with_hidden(&self, batch: &mut [(&[u32], &mut Cache)]) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        crate::check_segment_ids(batch, self.vocab_size())?;
        if !batch.iter().all(|(_, c)| self.fits(c)) {
            return Err(ModelError::Input("cache belongs to a different model".into()));
        }
        let (d, vocab) = (self.cfg.hidden_size, self.vocab_size());
        let ids: Vec<u32> = batch.iter().flat_map(|(ids, _)| ids.iter().copied()).collect();
        let mut segs: Vec<(usize, &mut Cache)> = batch.iter_mut().map(|(ids, c)| (ids.len(), &mut **c)).collect();
        let (logits, hidden) = crate::kernels::on_pool(|| {
            let h = self.decode_layers(&ids, &mut segs, Rows::Stepwise);
            let hidden = self.final_norm(&h);
            (self.head(&hidden, ids.len()), hidden)
        });
        let mut from = 0;
        Ok(batch
            .iter()
            .map(|(ids, _)| {
                let rows = from..from + ids.len();
                from = rows.end;
                (logits[rows.start * vocab..rows.end * vocab].to_vec(), hidden[rows.start * d..rows.end * d].to_vec())
            })
            .collect())
    }

    fn forward_batch_with_hidden_and_prompt(
        &self,
        batch: &mut [(&[u32], &mut Cache)],
        prompt: (&[u32], &mut Cache),
    ) -> Result<crate::WithHiddenAndPrompt> {
        let (ids, cache) = prompt;
        crate::check_segment_ids(batch, self.vocab_size())?;
        crate::check_ids(ids, self.vocab_size())?;
        if !batch.iter().all(|(_, c)| self.fits(c)) || !self.fits(cache) {
            return Err(ModelError::Input("cache belongs to a different model".into()));
        }
        if batch.is_empty() || ids.len() > crate::PROMPT_PIECE {
            let rows = self.forward_batch_with_hidden(batch)?;
            return Ok((rows, self.forward_with_hidden(ids, cache, false)?));
        }
        let (d, vocab) = (self.cfg.hidden_size, self.vocab_size());
        let prompt_rows = ids.len();
        let (all, mut segs) = decoder::segments_then_prompt(batch, (ids, cache));
        let stepwise_rows = all.len() - prompt_rows;
        let (logits, hidden) = crate::kernels::on_pool(|| {
            let h = self.decode_layers(&all, &mut segs, Rows::StepwiseThenPrompt);
            // Row-wise norm and head: each row's bits are those of the calls apart.
            let hidden = self.final_norm(&h);
            (self.head(&decoder::rows_for_head(&hidden, stepwise_rows, d), stepwise_rows + 1), hidden)
        });
        let mut from = 0;
        let rows = batch
            .iter()
            .map(|(ids, _)| {
                let r = from..from + ids.len();
                from = r.end;
                (logits[r.start * vocab..r.end * vocab].to_vec(), hidden[r.start * d..r.end * d].to_vec())
            })
            .collect();
        Ok((rows, (logits[stepwise_rows * vocab..].to_vec(), hidden[stepwise_rows * d..].to_vec())))
    }

    fn mtp_forward(
        &self,
        next_ids: &[u32],
        hidden: &[f32],
        cache: &mut Cache,
        all_logits: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let mtp = self.mtp.as_ref().ok_or_else(|| ModelError::Input("this model has no MTP head".into()))?;
        crate::check_ids(next_ids, self.vocab_size())?;
        let (t, d) = (next_ids.len(), self.cfg.hidden_size);
        if hidden.len() != t * d {
            return Err(ModelError::Input(format!(
                "MTP head: {} hidden values for {t} tokens of width {d}",
                hidden.len()
            )));
        }
        if !matches!(cache.layers.as_slice(), [LayerCache::Attention { .. }]) {
            return Err(ModelError::Input("cache is not an MTP head's cache".into()));
        }
        let act = self.act;
        let eps = self.eps();
        crate::kernels::on_pool(|| {
            let mut e = Vec::with_capacity(t * d);
            for &id in next_ids {
                e.extend(self.embed_tokens.row(id as usize));
            }
            let mut e = rms_norm(&e, &mtp.pre_fc_norm_embedding, eps);
            act.round(&mut e);
            let mut g = rms_norm(hidden, &mtp.pre_fc_norm_hidden, eps);
            act.round(&mut g);
            // [embedding ; hidden] per row: the order of the published modelling code's concat.
            let mut x = Vec::with_capacity(t * 2 * d);
            for (er, gr) in e.chunks_exact(d).zip(g.chunks_exact(d)) {
                x.extend_from_slice(er);
                x.extend_from_slice(gr);
            }
            let mut h = mtp.fc.matmul(&x, t);
            act.round(&mut h);
            let pos0 = cache.pos;
            let mut parts = [Segment { rows: t, pos0, state: &mut cache.layers[0], stepwise: false, kept: &mut [] }];
            self.run_layer(&mtp.layer, &mut h, t, &mut parts);
            cache.pos += t;
            let mut o = rms_norm(&h, &mtp.norm, eps);
            act.round(&mut o);
            let logits = if all_logits { self.head(&o, t) } else { self.head(&o[(t - 1) * d..], 1) };
            Ok((logits, o))
        })
    }
}
