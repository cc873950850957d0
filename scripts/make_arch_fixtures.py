"""Tiny random-weight checkpoints of the llama-family architectures people run as agents, each
as a Hugging Face folder and as a GGUF file, with llama.cpp's outputs on the GGUF:

    fixtures/arch/<name>/            config.json, model.safetensors (f32), tokenizer.json,
                                     tokenizer_config.json
    fixtures/arch/<name>.gguf        the same weights as llama.cpp's converter lays them out
    fixtures/arch/<name>.llama_cpp.json          prompt ids, top-1 and margins per position,
                                                 greedy tokens and text, the batch-vs-one-token
                                                 spread
    fixtures/arch/<name>.llama_cpp.safetensors   llama.cpp's logits, batch and one token at a time
    fixtures/arch/<name>-q8_0.gguf (+ its .llama_cpp.*)  for qwen3-tiny and llama3-tiny: the same
                                     weights with every matrix in Q8_0 (gguf-py's quantizer), as
                                     real files are quantized

The architectures (docs/model.md §8):
  qwen2-tiny    model_type qwen2, GGUF qwen2: q/k/v biases, tied head
  qwen3-tiny    model_type qwen3, GGUF qwen3: per-head q/k RMSNorm, head_dim·heads ≠ hidden
  llama3-tiny   model_type llama with rope_scaling llama3, GGUF llama + rope_freqs.weight, untied
  mistral-tiny  model_type mistral with a sliding window, GGUF llama (llama.cpp's converter
                takes MistralForCausalLM as LlamaModel), untied
  ministral3-tiny  model_type ministral3 (Ministral 3), GGUF mistral3: the llama graph with YaRN
                RoPE and Llama 4's attention temperature; the original context is 16 tokens so
                that the temperature changes from position 16 on, within the prompt
  smollm3-tiny  model_type smollm3 (SmolLM3), GGUF smollm3: the llama graph without RoPE in every
                fourth layer (4 layers here, so the last has none), tied head
  granite-tiny  model_type granite (IBM Granite 3.x), GGUF granite: the llama graph with four
                multipliers (embeddings, residual adds, attention scores, logits), untied
  phi3-tiny     model_type phi3 (Phi-3.5 / Phi-4-mini), GGUF phi3: fused qkv_proj and gate_up_proj,
                3/4 of each head rotated, LongRoPE with an original context of 16 tokens (so
                llama.cpp's 256-token context takes the long factors and the attention factor
                √(1 + ln 256 / ln 16)), untied

The GGUF files are written with gguf-py, the package that ships inside llama.cpp, following
what llama.cpp's convert_hf_to_gguf.py does for these classes (read in the vendored
conversion/llama.py and conversion/qwen.py): llama's q/k rows permuted for adjacent-pair RoPE
(`LlamaModel.permute`), the Llama 3 frequency factors computed as `generate_extra_tensors` does,
Qwen's rows kept in Hugging Face order. The converter itself needs torch; this script needs only
numpy. The tokenizer (1024-token byte-level BPE, Qwen3.5 pre-tokenizer) is the Qwen3.5 tiny
fixture's, in both forms: fixtures/qwen35-tiny/tokenizer.json and its GGUF metadata.

llama.cpp runs from the venv of scripts/setup-llama-reference.sh (llama-cpp-python 0.3.36, 2
threads, f16 KV cache; the script also installs the pyyaml gguf-py imports). Usage:
    .venv-llama/bin/python scripts/make_arch_fixtures.py [NAME ...]   (default: all)
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "fixtures", "arch")
TOKENIZER_DIR = os.path.join(ROOT, "fixtures", "qwen35-tiny")
TOKENIZER_GGUF = os.path.join(ROOT, "fixtures", "qwen35-tiny.gguf")

PROMPT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog."
N_GREEDY = 16
# The fixtures also written with Q8_0 matrices.
QUANTIZED = ["qwen3-tiny", "llama3-tiny"]

BASE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, vocab_size=1024, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=4096, hidden_act="silu", bos_token_id=None, eos_token_id=2)
ARCHS = {
    "qwen2-tiny": dict(gguf_arch="qwen2", seed=21, config=dict(
        BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=True,
        rope_theta=1000000.0, use_sliding_window=False, sliding_window=4096)),
    "qwen3-tiny": dict(gguf_arch="qwen3", seed=31, config=dict(
        BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True,
        num_attention_heads=4, num_key_value_heads=2, attention_bias=False, use_sliding_window=False)),
    "llama3-tiny": dict(gguf_arch="llama", seed=41, config=dict(
        BASE, architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, max_position_embeddings=2048,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=256))),
    "mistral-tiny": dict(gguf_arch="llama", seed=51, config=dict(
        BASE, architectures=["MistralForCausalLM"], model_type="mistral", tie_word_embeddings=False,
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=32768,
        sliding_window=4096)),
    "ministral3-tiny": dict(gguf_arch="mistral3", seed=61, config=dict(
        BASE, architectures=["Ministral3ForCausalLM"], model_type="ministral3", tie_word_embeddings=True,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rope_theta=None,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
                             beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.5,
                             llama_4_scaling_beta=0.1))),
    "smollm3-tiny": dict(gguf_arch="smollm3", seed=71, config=dict(
        BASE, architectures=["SmolLM3ForCausalLM"], model_type="smollm3", tie_word_embeddings=True,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, use_sliding_window=False,
        no_rope_layer_interval=4, no_rope_layers=[1, 1, 1, 0])),
    "granite-tiny": dict(gguf_arch="granite", seed=91, config=dict(
        BASE, architectures=["GraniteForCausalLM"], model_type="granite", tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
        embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.125, logits_scaling=2.0)),
    "phi3-tiny": dict(gguf_arch="phi3", seed=81, config=dict(
        BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", tie_word_embeddings=False,
        partial_rotary_factor=0.75, original_max_position_embeddings=16, sliding_window=2047,
        rope_scaling=dict(type="longrope", long_factor=[1.0, 1.3, 2.1, 4.5, 9.0, 17.0],
                          short_factor=[1.0, 1.05, 1.1, 1.2, 1.5, 2.0]))),
}


def sdist_root():
    """llama.cpp's tree inside the llama-cpp-python sdist (unpacked by llama_reference.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_reference

    return os.path.join(llama_reference.sdist_root(), "vendor", "llama.cpp")


def random_weights(cfg, seed):
    """Hugging Face-named f32 weights in checkpoint order."""
    rng = np.random.default_rng(seed)
    d, ffn, vocab, dh = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * dh, cfg["num_key_value_heads"] * dh
    w = {}

    def add(name, shape, scale, offset=0.0):
        w[name] = (offset + rng.uniform(-scale, scale, size=shape)).astype(np.float32)

    add("model.embed_tokens.weight", (vocab, d), 1.0)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", (d,), 0.2, 1.0)
        add(p + "self_attn.q_proj.weight", (q, d), 0.4)
        add(p + "self_attn.k_proj.weight", (kv, d), 0.4)
        add(p + "self_attn.v_proj.weight", (kv, d), 0.4)
        if cfg["model_type"] == "qwen2":
            add(p + "self_attn.q_proj.bias", (q,), 0.5)
            add(p + "self_attn.k_proj.bias", (kv,), 0.5)
            add(p + "self_attn.v_proj.bias", (kv,), 0.5)
        if cfg["model_type"] == "qwen3":
            add(p + "self_attn.q_norm.weight", (dh,), 0.3, 1.0)
            add(p + "self_attn.k_norm.weight", (dh,), 0.3, 1.0)
        add(p + "self_attn.o_proj.weight", (d, q), 0.4)
        add(p + "post_attention_layernorm.weight", (d,), 0.2, 1.0)
        add(p + "mlp.gate_proj.weight", (ffn, d), 0.4)
        add(p + "mlp.up_proj.weight", (ffn, d), 0.4)
        add(p + "mlp.down_proj.weight", (d, ffn), 0.4)
    add("model.norm.weight", (d,), 0.2, 1.0)
    if not cfg["tie_word_embeddings"]:
        add("lm_head.weight", (vocab, d), 0.5)
    if cfg["model_type"] == "phi3":
        # Phi3ForCausalLM stores q/k/v and gate/up each as one matrix.
        fused = {}
        for name, a in w.items():
            if name.endswith("self_attn.q_proj.weight"):
                p = name[: -len("q_proj.weight")]
                fused[p + "qkv_proj.weight"] = np.concatenate([a, w[p + "k_proj.weight"], w[p + "v_proj.weight"]])
            elif name.endswith("mlp.gate_proj.weight"):
                p = name[: -len("gate_proj.weight")]
                fused[p + "gate_up_proj.weight"] = np.concatenate([a, w[p + "up_proj.weight"]])
            elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
                fused[name] = a
        w = fused
    return w


def write_safetensors(path, tensors):
    """The safetensors format by hand (8-byte header length, JSON header, raw little-endian data)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        dtype = {np.float32: "F32", np.int64: "I64"}[a.dtype.type]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def permute(w, n_head, n_head_kv):
    """llama.cpp's `LlamaModel.permute`: each head's rows from rotate-half to adjacent pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_factors(cfg):
    """`LlamaModel.generate_extra_tensors` of the converter, in float32 as torch computes it."""
    rs = cfg["rope_scaling"]
    base, dim = cfg["rope_theta"], cfg["head_dim"]
    freqs = (1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))).astype(np.float32)
    factor, low, high = np.float32(rs["factor"]), np.float32(rs["low_freq_factor"]), np.float32(rs["high_freq_factor"])
    old = np.float32(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(np.float32(1))
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(np.float32(1) / ((np.float32(1) - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
}


def write_gguf(gguf, path, name, arch, cfg, weights, qtype=None):
    tok = gguf.GGUFReader(TOKENIZER_GGUF)
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_type("model")
    # (llama.cpp gives the special tokens of a model whose name holds "phi3" Phi-3's strip
    # attributes, looking up `</s>`, which the tiny vocabulary lacks.)
    w.add_name(name.replace("phi3", "phi-three"))
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters", {})
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta")))
    if rope.get("rope_type") == "yarn":
        # conversion/base.py's yarn branch, and Mistral3Model's two extra keys.
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    rot = cfg.get("partial_rotary_factor", 1.0)
    w.add_rope_dimension_count(int(rot * cfg["head_dim"]))
    if arch == "phi3":
        # conversion/phi.py's Phi3MiniModel: the original context, the sliding window (which
        # llama.cpp then ignores), and LongRoPE's attention factor.
        orig, longest = cfg["original_max_position_embeddings"], cfg["max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(longest / orig) / math.log(orig)))
    if arch in ("llama", "mistral3", "smollm3", "granite"):
        w.add_vocab_size(cfg["vocab_size"])
    if arch == "granite":
        # conversion/granite.py: the `_multiplier` fields as `_scale` keys.
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype else gguf.LlamaFileType.ALL_F32)
    # The tokenizer, chat template and stop ids of the Qwen3.5 tiny fixture, as they are.
    for key in ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]:
        field = tok.fields[key]
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for hf, a in weights.items():
        if hf == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif hf == "lm_head.weight":
            g = "output.weight"
        elif hf == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, layer, suffix = hf.split(".", 3)
            g = f"blk.{layer}.{GGUF_LAYER[suffix]}"
            if arch in ("llama", "mistral3", "smollm3", "granite") and suffix == "self_attn.q_proj.weight":
                a = permute(a, heads, heads)
            elif arch in ("llama", "mistral3", "smollm3", "granite") and suffix == "self_attn.k_proj.weight":
                a = permute(a, heads, kv_heads)
        if qtype is not None and a.ndim == 2:
            w.add_tensor(g, gguf.quants.quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, np.ascontiguousarray(a))
    if cfg.get("rope_scaling", {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(cfg))
    if arch == "phi3":
        for kind in ["long", "short"]:
            w.add_tensor(f"rope_factors_{kind}.weight", np.array(cfg["rope_scaling"][f"{kind}_factor"], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(gguf_path):
    """llama.cpp on the GGUF: the prompt's logits in one batch and one token at a time, and 16
    greedy tokens decoded one at a time."""
    from llama_cpp import Llama

    # yarn_beta_* = -1: take the file's values, as llama-cli does (llama-cpp-python's defaults,
    # 32 and 1, would override them).
    llm = Llama(model_path=gguf_path, n_ctx=256, n_threads=2, n_batch=256, logits_all=True, verbose=False, seed=0,
                yarn_beta_fast=-1.0, yarn_beta_slow=-1.0)
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    llm.reset()
    llm.eval(ids)
    batch = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.reset()
    for t in ids:
        llm.eval([t])
    single = np.array(llm.scores[: len(ids)], dtype=np.float32)
    top2 = np.sort(batch, axis=-1)[:, -2:]
    greedy, greedy_margin = [], []
    step = single[-1]
    for _ in range(N_GREEDY):
        nxt = int(step.argmax())
        b, a = np.sort(step)[-2:]
        greedy.append(nxt)
        greedy_margin.append(round(float(a - b), 5))
        llm.eval([nxt])
        step = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    import llama_cpp
    with open("/proc/cpuinfo") as f:
        flags = next((line for line in f if line.startswith("flags")), "").split()
    meta = {
        "llama_cpp_python": llama_cpp.__version__,
        # llama.cpp's kernels, and ours, sum in an order that depends on the SIMD level.
        "cpu_simd": "avx512" if "avx512f" in flags else "avx2",
        "build": "GGML_NATIVE=ON, -mno-amx-tile -mno-amx-int8 -mno-amx-bf16; 2 threads; f16 KV cache",
        "prompt": PROMPT,
        "ids": ids,
        "argmax": batch.argmax(-1).tolist(),
        "argmax_margin": [round(float(a - b), 5) for b, a in top2],
        "batch_vs_single_max_abs": float(np.abs(batch - single).max()),
        "max_abs_logit": float(np.abs(batch).max()),
        "greedy": greedy,
        "greedy_margin": greedy_margin,
        "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"),
    }
    return meta, {"batch": batch, "single": single}


def main():
    lcpp = sdist_root()
    sys.path.insert(0, os.path.join(lcpp, "gguf-py"))
    import gguf

    os.makedirs(OUT, exist_ok=True)
    wanted = sys.argv[1:] or list(ARCHS)
    unknown = [n for n in wanted if n not in ARCHS]
    if unknown:
        sys.exit(f"unknown fixture(s) {unknown}; known: {list(ARCHS)}")
    for name, spec in ARCHS.items():
        if name not in wanted:
            continue
        cfg = {k: v for k, v in spec["config"].items() if v is not None}
        weights = random_weights(cfg, spec["seed"])
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"), weights)
        for t in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(os.path.join(TOKENIZER_DIR, t), d)
        variants = [(name, None)]
        if name in QUANTIZED:
            variants.append((name + "-q8_0", gguf.GGMLQuantizationType.Q8_0))
        for out_name, qtype in variants:
            gguf_path = os.path.join(OUT, out_name + ".gguf")
            write_gguf(gguf, gguf_path, out_name, spec["gguf_arch"], cfg, weights, qtype)
            meta, logits = reference(gguf_path)
            with open(os.path.join(OUT, out_name + ".llama_cpp.json"), "w") as f:
                json.dump(meta, f, indent=1)
                f.write("\n")
            write_safetensors(os.path.join(OUT, out_name + ".llama_cpp.safetensors"), logits)
            print(f"{out_name}: {len(meta['ids'])} prompt tokens, batch-vs-single spread "
                  f"{meta['batch_vs_single_max_abs']:.3g}, min top-2 margin {min(meta['argmax_margin']):.3g}, "
                  f"greedy {meta['greedy_text']!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
