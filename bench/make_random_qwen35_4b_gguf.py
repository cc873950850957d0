#!/usr/bin/env python3
"""Writes a GGUF of random weights in the real Qwen3.5-4B text shapes (docs/model.md §1.2), Q8_0,
with the metadata and tensor names llama.cpp's convert_hf_to_gguf.py writes for the `qwen35`
architecture and the real Qwen3.5 vocabulary (models/qwen35-tokenizer), without torch or
transformers: numpy and the gguf-py vendored in the llama-cpp-python sdist.

Usage: .venv-llama/bin/python bench/make_random_qwen35_4b_gguf.py OUT.gguf

bench/gguf_speed.sh --qwen35-4b re-quantizes the result to Q4_K_M with llama.cpp's quantizer
(as it does for every row of its matrix) and deletes it. Values follow what the reference code
initializes and the converter stores: matrices N(0, 0.02), RMSNorm weights 1 (the converter's
`w + 1` of Qwen3.5's zero-initialized norms; the gated-delta-net output norm is plain ones),
`ssm_a = -exp(A_log)` with A_log = log U(1, 16), `dt_bias` ones, the causal conv U(-0.5, 0.5)
(PyTorch's default for a 4-tap depthwise conv). About 4.5 GB written, 5 GB of memory, a few
minutes on two cores.
"""
import json, os, sys, time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import llama_reference as lr  # finds (and unpacks) the llama-cpp-python sdist

sys.path.insert(0, os.path.join(lr.sdist_root(), "vendor", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

# The Qwen3.5-4B text configuration (config.json's text_config).
HIDDEN, FFN, LAYERS, VOCAB = 2560, 9216, 32, 248320
HEADS, KV_HEADS, HEAD_DIM = 16, 4, 256
LIN_K_HEADS, LIN_V_HEADS, LIN_K_DIM, LIN_V_DIM, CONV = 16, 32, 128, 128, 4
ROPE_THETA, PARTIAL_ROTARY, MROPE = 1e7, 0.25, [11, 11, 10, 0]
INTERVAL = 4


def vocab(tok_dir):
    """Tokens, token types and merges as the converter's gpt2 vocabulary writes them."""
    t = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    by_id = {i: s for s, i in t["model"]["vocab"].items()}
    types = {i: gguf.TokenType.NORMAL for i in by_id}
    for a in t["added_tokens"]:
        by_id[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    tokens, toktypes = [], []
    for i in range(VOCAB):
        if i in by_id:
            tokens.append(by_id[i])
            toktypes.append(types[i])
        else:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
    ids = {a["content"]: a["id"] for a in t["added_tokens"]}
    return tokens, toktypes, merges, ids


def q8_0(rng, rows, cols, std):
    """A [rows, cols] matrix of N(0, std) quantized to Q8_0, a few thousand rows at a time."""
    out = np.empty((rows, cols // 32 * 34), dtype=np.uint8)
    step = max(1, (1 << 24) // cols)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        x = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(std)
        out[r:r + n] = gguf.quants.quantize(x, Q.Q8_0)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    tok_dir = os.path.join(here, "..", "models", "qwen35-tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        sys.exit(f"{tok_dir}/tokenizer.json missing: run scripts/setup-qwen35-tokenizer.sh")
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(out + ".part", "qwen35")
    w.add_type("model")
    w.add_name("Qwen3.5-4B shape, random weights")
    w.add_block_count(LAYERS)
    w.add_context_length(262144)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_sections(MROPE)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_ssm_conv_kernel(CONV)
    w.add_ssm_state_size(LIN_K_DIM)
    w.add_ssm_group_count(LIN_K_HEADS)
    w.add_ssm_time_step_rank(LIN_V_HEADS)
    w.add_ssm_inner_size(LIN_V_DIM * LIN_V_HEADS)
    w.add_recurrent_layers([i % INTERVAL != INTERVAL - 1 for i in range(LAYERS)])
    w.add_full_attention_interval(INTERVAL)
    w.add_rope_dimension_count(int(HEAD_DIM * PARTIAL_ROTARY))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, toktypes, merges, ids = vocab(tok_dir)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    w.add_token_merges(merges)
    w.add_eos_token_id(ids["<|im_end|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    template = os.path.join(tok_dir, "chat_template.jinja")
    if os.path.exists(template):
        w.add_chat_template(open(template, encoding="utf-8").read())

    t0 = time.time()

    def matrix(name, rows, cols):
        w.add_tensor(name, q8_0(rng, rows, cols, 0.02), raw_dtype=Q.Q8_0)

    def vector(name, values):
        w.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    # Tied embeddings: token_embd serves as the output head too (no output.weight).
    matrix("token_embd.weight", VOCAB, HIDDEN)
    conv_ch = 2 * LIN_K_HEADS * LIN_K_DIM + LIN_V_HEADS * LIN_V_DIM
    for i in range(LAYERS):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", np.ones(HIDDEN))
        if i % INTERVAL != INTERVAL - 1:
            vector(p + "ssm_a", -rng.uniform(1.0, 16.0, LIN_V_HEADS))
            vector(p + "ssm_conv1d.weight", rng.uniform(-0.5, 0.5, (conv_ch, CONV)))
            vector(p + "ssm_dt.bias", np.ones(LIN_V_HEADS))
            matrix(p + "ssm_alpha.weight", LIN_V_HEADS, HIDDEN)
            matrix(p + "ssm_beta.weight", LIN_V_HEADS, HIDDEN)
            matrix(p + "attn_qkv.weight", conv_ch, HIDDEN)
            matrix(p + "attn_gate.weight", LIN_V_HEADS * LIN_V_DIM, HIDDEN)
            vector(p + "ssm_norm.weight", np.ones(LIN_V_DIM))
            matrix(p + "ssm_out.weight", HIDDEN, LIN_V_HEADS * LIN_V_DIM)
        else:
            # The query projection carries the output gate: 2 · heads · head_dim rows.
            matrix(p + "attn_q.weight", 2 * HEADS * HEAD_DIM, HIDDEN)
            matrix(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            matrix(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
            matrix(p + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
            vector(p + "attn_q_norm.weight", np.ones(HEAD_DIM))
            vector(p + "attn_k_norm.weight", np.ones(HEAD_DIM))
        matrix(p + "ffn_gate.weight", FFN, HIDDEN)
        matrix(p + "ffn_up.weight", FFN, HIDDEN)
        matrix(p + "ffn_down.weight", HIDDEN, FFN)
        vector(p + "post_attention_norm.weight", np.ones(HIDDEN))
        print(f"layer {i + 1}/{LAYERS} generated ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    vector("output_norm.weight", np.ones(HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.rename(out + ".part", out)
    print(f"written: {out} ({os.path.getsize(out) / 1e9:.2f} GB, {time.time() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
