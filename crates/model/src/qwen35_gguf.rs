//! Qwen3.5 from a GGUF file (llama.cpp architecture `qwen35`, shared/docs/qwen35.md §2.2).
//!
//! llama.cpp's converter already stores what [`Qwen35`] holds: the zero-centred norms as
//! `1 + w` (but `ssm_norm` as plain `w`), `A` as `ssm_a = −exp(A_log)`, and the value heads of
//! every DeltaNet tensor in tiled order, so value head `v` reads key head `v mod Hk`. The conv
//! kernel `ssm_conv1d` is `[K, channels]` in ggml order, i.e. channel-major in memory, which is
//! our `[channels, K]` layout. Activations are f32 whatever the weight type, as in llama.cpp.

use crate::config::{LayerType, Qwen35Config};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::kernels::Act;
use crate::qwen35::{GatedAttention, GatedDeltaNet, Layer, Mixer, Mlp, Qwen35};

/// Reads the `qwen35.*` hyper-parameters of a GGUF file.
pub fn config_from_gguf(f: &GgufFile) -> Result<Qwen35Config> {
    let arch = f.get_str("general.architecture")?.unwrap_or("");
    if arch != "qwen35" {
        return Err(ModelError::format(f.path(), format!("general.architecture is {arch:?}, expected \"qwen35\"")));
    }
    let k = |s: &str| format!("qwen35.{s}");
    let n_layers = f.req_usize(&k("block_count"))?;
    let layer_types: Vec<LayerType> = if let Some(v) = f.get(&k("attention.recurrent_layers")) {
        let arr = v.as_array().ok_or_else(|| {
            ModelError::format(f.path(), "metadata `qwen35.attention.recurrent_layers` is not an array")
        })?;
        arr.iter()
            .map(|e| match e.as_bool() {
                Some(true) => Ok(LayerType::Linear),
                Some(false) => Ok(LayerType::Full),
                None => Err(ModelError::format(f.path(), "`qwen35.attention.recurrent_layers` holds a non-bool")),
            })
            .collect::<Result<_>>()?
    } else {
        let every = f.req_usize(&k("full_attention_interval"))?;
        if every == 0 {
            return Err(ModelError::format(f.path(), "`qwen35.full_attention_interval` is 0"));
        }
        (0..n_layers).map(|i| if (i + 1).is_multiple_of(every) { LayerType::Full } else { LayerType::Linear }).collect()
    };
    if layer_types.len() != n_layers {
        return Err(ModelError::format(
            f.path(),
            format!("{} layer types for block_count {n_layers}", layer_types.len()),
        ));
    }
    let head_dim = f.req_usize(&k("attention.key_length"))?;
    let rope_dim = f.get_u64(&k("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
    let state = f.req_usize(&k("ssm.state_size"))?;
    let hv = f.req_usize(&k("ssm.time_step_rank"))?;
    let hk = f.req_usize(&k("ssm.group_count"))?;
    if hk == 0 || !hv.is_multiple_of(hk) || head_dim == 0 {
        return Err(ModelError::format(
            f.path(),
            format!("ssm.time_step_rank {hv} is not a multiple of ssm.group_count {hk}"),
        ));
    }
    let inner = f.req_usize(&k("ssm.inner_size"))?;
    if inner != hv * state {
        return Err(ModelError::format(
            f.path(),
            format!("ssm.inner_size {inner} ≠ ssm.time_step_rank {hv} × ssm.state_size {state}"),
        ));
    }
    let vocab = f
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| ModelError::MissingTensor { path: f.path().to_path_buf(), name: "token_embd.weight".into() })?;
    let eos: Vec<u32> = f.get_u64("tokenizer.ggml.eos_token_id")?.map(|v| v as u32).into_iter().collect();
    Ok(Qwen35Config {
        vocab_size: vocab,
        hidden_size: f.req_usize(&k("embedding_length"))?,
        intermediate_size: f.req_usize(&k("feed_forward_length"))?,
        num_hidden_layers: n_layers,
        num_attention_heads: f.req_usize(&k("attention.head_count"))?,
        num_key_value_heads: f.req_usize(&k("attention.head_count_kv"))?,
        head_dim,
        rms_norm_eps: f.get_f64(&k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        tie_word_embeddings: !f.contains("output.weight"),
        linear_conv_kernel_dim: f.req_usize(&k("ssm.conv_kernel"))?,
        linear_key_head_dim: state,
        linear_value_head_dim: state,
        linear_num_key_heads: hk,
        linear_num_value_heads: hv,
        layer_types,
        rope_theta: f.get_f64(&k("rope.freq_base"))?.unwrap_or(1e7),
        partial_rotary_factor: rope_dim as f64 / head_dim as f64,
        max_position_embeddings: f.get_u64(&k("context_length"))?.map_or(262_144, |v| v as usize),
        eos_token_ids: eos,
    })
}

/// Builds a [`Qwen35`] from a `qwen35` GGUF file; tensors stay memory-mapped.
pub fn qwen35_from_gguf(f: &GgufFile) -> Result<Qwen35> {
    let cfg = config_from_gguf(f)?;
    let d = cfg.hidden_size;
    let embed = f.matrix("token_embd.weight", cfg.vocab_size, d)?;
    let lm_head = if f.contains("output.weight") { Some(f.matrix("output.weight", cfg.vocab_size, d)?) } else { None };
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for (i, ty) in cfg.layer_types.iter().enumerate() {
        let p = |n: &str| format!("blk.{i}.{n}");
        let mixer = match ty {
            LayerType::Full => {
                let (hq, hkv, dh) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
                Mixer::Attention(GatedAttention {
                    q_proj: f.matrix(&p("attn_q.weight"), hq * 2 * dh, d)?,
                    k_proj: f.matrix(&p("attn_k.weight"), hkv * dh, d)?,
                    v_proj: f.matrix(&p("attn_v.weight"), hkv * dh, d)?,
                    o_proj: f.matrix(&p("attn_output.weight"), d, hq * dh)?,
                    q_norm: f.f32(&p("attn_q_norm.weight"), dh)?,
                    k_norm: f.f32(&p("attn_k_norm.weight"), dh)?,
                })
            }
            LayerType::Linear => {
                let (hk, hv, dv, kk) = (
                    cfg.linear_num_key_heads,
                    cfg.linear_num_value_heads,
                    cfg.linear_value_head_dim,
                    cfg.linear_conv_kernel_dim,
                );
                let conv_dim = cfg.conv_dim();
                Mixer::DeltaNet(GatedDeltaNet {
                    in_proj_qkv: f.matrix(&p("attn_qkv.weight"), conv_dim, d)?,
                    in_proj_z: f.matrix(&p("attn_gate.weight"), hv * dv, d)?,
                    in_proj_b: f.matrix(&p("ssm_beta.weight"), hv, d)?,
                    in_proj_a: f.matrix(&p("ssm_alpha.weight"), hv, d)?,
                    conv1d: f.f32(&p("ssm_conv1d.weight"), conv_dim * kk)?,
                    dt_bias: f.f32(&p("ssm_dt.bias"), hv)?,
                    neg_a: f.f32(&p("ssm_a"), hv)?,
                    norm: f.f32(&p("ssm_norm.weight"), dv)?,
                    out_proj: f.matrix(&p("ssm_out.weight"), d, hv * dv)?,
                    key_head: (0..hv).map(|v| v % hk).collect(),
                })
            }
        };
        layers.push(Layer {
            input_norm: f.f32(&p("attn_norm.weight"), d)?,
            post_attention_norm: f.f32(&p("post_attention_norm.weight"), d)?,
            mixer,
            mlp: Mlp {
                gate: f.matrix(&p("ffn_gate.weight"), cfg.intermediate_size, d)?,
                up: f.matrix(&p("ffn_up.weight"), cfg.intermediate_size, d)?,
                down: f.matrix(&p("ffn_down.weight"), d, cfg.intermediate_size)?,
            },
        });
    }
    let norm = f.f32("output_norm.weight", d)?;
    Ok(Qwen35::new(cfg, embed, lm_head, layers, norm, Act::F32))
}

/// Re-quantizes every weight matrix of a Qwen3.5 model to `q` (`--quant`); matrices too
/// narrow for its blocks fall back as [`crate::tensor::Matrix::quantized`] describes. The
/// model then computes in f32, as llama.cpp does with quantized weights.
pub fn quantize_qwen35(m: &mut Qwen35, q: crate::quant::QuantType) {
    m.embed_tokens = m.embed_tokens.quantized(q);
    if let Some(h) = m.lm_head.as_mut() {
        *h = h.quantized(q);
    }
    for mm in layer_matrices(m) {
        *mm = mm.quantized(q);
    }
    m.act = Act::F32;
}

/// Repacks the matmul weights of a Qwen3.5 model for this CPU's fastest kernels
/// ([`crate::tensor::Matrix::pack_for_matmul`]): every projection and the output head (the
/// tied embedding when there is none; its row lookups still answer, from the file or unpacked
/// from the packed copy).
pub fn pack_qwen35(m: &mut Qwen35) {
    match m.lm_head.as_mut() {
        Some(h) => h.pack_for_matmul(),
        None => m.embed_tokens.pack_for_matmul(),
    }
    for mm in layer_matrices(m) {
        mm.pack_for_matmul();
    }
}

/// Every projection matrix of every layer (mixer, then MLP).
fn layer_matrices(m: &mut Qwen35) -> impl Iterator<Item = &mut crate::tensor::Matrix> {
    m.layers.iter_mut().flat_map(|l| {
        let mixer: Vec<&mut crate::tensor::Matrix> = match &mut l.mixer {
            Mixer::Attention(a) => vec![&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj],
            Mixer::DeltaNet(n) => {
                vec![&mut n.in_proj_qkv, &mut n.in_proj_z, &mut n.in_proj_b, &mut n.in_proj_a, &mut n.out_proj]
            }
        };
        mixer.into_iter().chain([&mut l.mlp.gate, &mut l.mlp.up, &mut l.mlp.down])
    })
}

/// Bytes of the weight matrices of a Qwen3.5 model (after any re-quantization).
pub fn qwen35_weight_bytes(m: &Qwen35) -> usize {
    let mut n = m.embed_tokens.byte_len() + m.lm_head.as_ref().map_or(0, |h| h.byte_len());
    for l in &m.layers {
        n += match &l.mixer {
            Mixer::Attention(a) => {
                [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj].iter().map(|x| x.byte_len()).sum::<usize>()
            }
            Mixer::DeltaNet(d) => [&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a, &d.out_proj]
                .iter()
                .map(|x| x.byte_len())
                .sum::<usize>(),
        };
        n += l.mlp.gate.byte_len() + l.mlp.up.byte_len() + l.mlp.down.byte_len();
    }
    n
}
