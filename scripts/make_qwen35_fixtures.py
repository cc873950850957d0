#!/usr/bin/env python3
"""Tiny random-weight Qwen3.5 checkpoints and their reference outputs from transformers.

Recipe: docs/model.md §6.2 (transformers==5.23.0 + torch on CPU, eager attention,
torch reference delta-rule kernels — flash-linear-attention must NOT be installed).

Writes, under fixtures/ (committed; each folder is a loadable checkpoint):
  qwen35-tiny/            §6.2 config: f32, tied head, 3:1 block + 2 attention layers,
                          150-token prompt (3 chunks of 64, ragged tail); golden.safetensors
                          holds full logits, cached prefill + greedy decode, split prefill,
                          per-layer activations and bf16 logits of the same weights.
                          mtp.safetensors (a shard of its own) is a multi-token-prediction
                          head (`mtp.*`); qwen35-tiny.mtp.golden.safetensors holds the main
                          model's last hidden states and the head's outputs from the torch
                          reference below (transformers itself ignores `mtp.*`).
  qwen35-tiny-bf16/       the same weights stored as bf16; golden = bf16 transformers run.
  qwen35-wrapper-untied/  multimodal wrapper config (text_config), `model.language_model.`
                          prefix, untied lm_head, vision/mtp tensors to be skipped,
                          irregular layer_types, dk != dv; golden like qwen35-tiny.
Also a small byte-level BPE tokenizer (vocab 1024) with a ChatML template, so the tiny
checkpoints can be run from the command line end to end.

Usage: scripts/make-qwen35-fixtures.sh (sets up the venv and runs this).
"""
import copy
import json
import os
import sys

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


class MtpReference(nn.Module):
    """The Qwen3.5 multi-token-prediction head as the published serving code defines it
    (vLLM's Qwen3_5MultiTokenPredictor; written here from reading it, with transformers'
    own decoder layer and norm): for position i, norm(embed(x[i+1])) and norm(h[i]) (h the
    main model's last hidden state, after its final norm) concatenated in that order, fc to d,
    one full-attention decoder layer at position i, the head's norm; logits from the main
    model's lm_head."""

    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(d, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(d, eps=eps)
        # Any full-attention index gives the layer type; the index only names a cache slot.
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))])
        self.norm = Qwen3_5RMSNorm(d, eps=eps)

    def forward(self, model, next_ids, hidden):
        """Rows r = 0..T-1 at positions 0..T-1, causal, no cache; returns (normed out, logits)."""
        e = model.model.embed_tokens(next_ids)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden)], -1))
        T = x.shape[1]
        pos = torch.arange(T).view(1, 1, -1)
        pe = model.model.rotary_emb(x, pos)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=pe, attention_mask=mask)
        o = self.norm(x)
        return o, model.lm_head(o)


def make_mtp(cfg, seed):
    torch.manual_seed(seed)
    mtp = MtpReference(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
    return mtp


def mtp_reference(model, mtp, ids, drafts=4):
    """The main model's last hidden states over the prompt, the head over every (x[i+1], h[i])
    pair, and a chain of `drafts` greedy drafts after the prompt's next token: each draft's
    pair is (the draft before, the head's own output before), at the next position."""
    with torch.no_grad():
        h = model.model(ids).last_hidden_state
        nxt = model.lm_head(h[:, -1:]).argmax(-1)
        toks = torch.cat([ids[:, 1:], nxt], 1)
        o, lg = mtp(model, toks, h)
        rec = {"mtp_input_ids": ids, "main_hidden": h, "mtp_hidden": o, "mtp_logits": lg, "next_token": nxt}
        hid, chain, chain_logits = h, [], []
        for _ in range(drafts):
            d = lg[:, -1:].argmax(-1)
            chain.append(d)
            chain_logits.append(lg[:, -1])
            toks = torch.cat([toks, d], 1)
            hid = torch.cat([hid, o[:, -1:]], 1)
            o, lg = mtp(model, toks, hid)
        rec["draft_tokens"] = torch.cat(chain, 1)
        rec["draft_logits"] = torch.stack(chain_logits, 1)
    return rec


def make_model(seed, **overrides):
    torch.manual_seed(seed)
    kw = dict(
        vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention"] * 3 + ["full_attention", "linear_attention", "full_attention"],
        rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        eos_token_id=2)
    kw.update(overrides)
    cfg = Qwen3_5TextConfig(**kw)
    model = Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():  # make every parameter matter
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                if name.endswith("linear_attn.norm.weight"):
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, 0.2)
            elif "conv1d" in name:
                p.normal_(0.0, 0.5)
            elif p.ndim == 2:
                p.normal_(0.0, 1.0 if "embed_tokens" in name else p.shape[1] ** -0.5)
    return cfg, model


def reference(cfg, model, T0=150, T1=100, N=8, with_acts=True, with_bf16=True):
    ids = torch.randint(3, cfg.vocab_size, (1, T0), generator=torch.Generator().manual_seed(1))
    rec = {"input_ids": ids}
    hooks, acts = [], {}

    def grab(key):
        def f(_m, _i, o):
            acts[key] = (o[0] if isinstance(o, tuple) else o).detach().clone()
        return f

    if with_acts:
        for i, layer in enumerate(model.model.layers):
            mixer = layer.linear_attn if cfg.layer_types[i] == "linear_attention" else layer.self_attn
            hooks += [layer.register_forward_hook(grab(f"layer{i}.out")),
                      mixer.register_forward_hook(grab(f"layer{i}.mixer")),
                      layer.mlp.register_forward_hook(grab(f"layer{i}.mlp"))]
        hooks.append(model.model.norm.register_forward_hook(grab("final_norm")))
    with torch.no_grad():
        rec["logits_full"] = model(ids).logits
        # transformers' own f32 rounding noise, measured against an f64 run of the same
        # weights: the yardstick for "numerically equal" when logits are large.
        rec["logits_full_f64"] = copy.deepcopy(model).to(torch.float64)(ids).logits
    rec.update({f"act.{k}": v for k, v in acts.items()})
    for h in hooks:
        h.remove()
    with torch.no_grad():
        cache = DynamicCache(config=cfg)
        lg = model(ids, past_key_values=cache, use_cache=True).logits
        rec["logits_prefill_last"] = lg[:, -1:]
        toks, steps = [], []
        nxt = lg[:, -1].argmax(-1, keepdim=True)
        for _ in range(N):
            toks.append(nxt)
            lg = model(nxt, past_key_values=cache, use_cache=True).logits
            steps.append(lg[:, -1])
            nxt = lg[:, -1].argmax(-1, keepdim=True)
        rec["greedy_tokens"] = torch.cat(toks, 1)
        rec["logits_decode"] = torch.stack(steps, 1)
        full = model(torch.cat([ids, rec["greedy_tokens"]], 1)).logits
        assert torch.allclose(full[:, T0 - 1:-1], torch.cat([rec["logits_prefill_last"],
                              rec["logits_decode"][:, :-1]], 1), atol=1e-4)
        cache2 = DynamicCache(config=cfg)
        a = model(ids[:, :T1], past_key_values=cache2, use_cache=True).logits
        b = model(ids[:, T1:], past_key_values=cache2, use_cache=True).logits
        rec["logits_split_prefill"] = torch.cat([a, b], 1)
        if with_bf16:
            m16 = copy.deepcopy(model).to(torch.bfloat16)
            rec["logits_full_bf16"] = m16(ids).logits.float()
    return rec


def save_golden(rec, out):
    save_file({k: v.contiguous().float() if v.is_floating_point() else v.contiguous().to(torch.int64)
               for k, v in rec.items()}, f"{out}.golden.safetensors")  # beside the folder: not a weight shard


def write_tokenizer(out):
    """A 1024-token byte-level BPE with ChatML specials, trained on this script's own text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = open(__file__).read().splitlines() * 4 + ["Hello, how are you? The quick brown fox jumps over the lazy dog."] * 20
    tok.train_from_iterator(corpus, trainer)
    tok.save(f"{out}/tokenizer.json")
    chatml = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "add_bos_token": False, "chat_template": chatml}, open(f"{out}/tokenizer_config.json", "w"), indent=2)
    json.dump({"eos_token_id": [2, 0], "temperature": 0.6, "top_p": 0.95, "top_k": 20},
              open(f"{out}/generation_config.json", "w"), indent=2)


def main():
    assert torch.__version__ and "fla" not in sys.modules
    import transformers
    assert transformers.__version__ == "5.23.0", transformers.__version__

    # 1. §6.2 checkpoint, f32, tied.
    out = os.path.join(ROOT, "qwen35-tiny")
    os.makedirs(out, exist_ok=True)
    cfg, model = make_model(0)
    cfg.to_json_file(f"{out}/config.json")
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, f"{out}/model.safetensors")
    save_golden(reference(cfg, model), out)
    write_tokenizer(out)
    # The MTP head: a shard of its own, drawn after the main weights (which it leaves as
    # they were), and its reference outputs beside the folder.
    mtp = make_mtp(cfg, 100)
    save_file({"mtp." + k: v.contiguous() for k, v in mtp.state_dict().items()}, f"{out}/mtp.safetensors")
    ids = torch.randint(3, cfg.vocab_size, (1, 150), generator=torch.Generator().manual_seed(1))
    save_golden(mtp_reference(model, mtp, ids), f"{out}.mtp")

    # 2. Same weights stored as bf16; golden from the bf16 model itself.
    out16 = os.path.join(ROOT, "qwen35-tiny-bf16")
    os.makedirs(out16, exist_ok=True)
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    cfg.to_json_file(f"{out16}/config.json")
    save_file({k: v.contiguous() for k, v in m16.state_dict().items() if k != "lm_head.weight"},
              f"{out16}/model.safetensors")
    ids = torch.randint(3, cfg.vocab_size, (1, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        save_golden({"input_ids": ids, "logits_full_bf16": m16(ids).logits.float()}, out16)

    # 3. Multimodal wrapper, untied head, irregular layer types, dk != dv, two shards.
    outw = os.path.join(ROOT, "qwen35-wrapper-untied")
    os.makedirs(outw, exist_ok=True)
    cfgw, mw = make_model(5, tie_word_embeddings=False, linear_value_head_dim=24, num_hidden_layers=5,
                          layer_types=["full_attention", "linear_attention", "linear_attention",
                                       "full_attention", "linear_attention"])
    text = cfgw.to_dict()
    text["model_type"] = "qwen3_5_text"
    wrapper = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
               "text_config": text, "tie_word_embeddings": False, "image_token_id": 248056,
               "vision_config": {"depth": 1, "hidden_size": 8}}
    json.dump(wrapper, open(f"{outw}/config.json", "w"), indent=2)
    sd = {}
    for k, v in mw.state_dict().items():
        k = k if k == "lm_head.weight" else "model.language_model." + k[len("model."):]
        sd[k] = v.contiguous()
    sd["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(24, 8)
    sd["mtp.fc.weight"] = torch.zeros(64, 128)
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, f"{outw}/{fname}")
        weight_map.update({k: fname for k in keys})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(f"{outw}/model.safetensors.index.json", "w"), indent=2)
    save_golden(reference(cfgw, mw, with_acts=False, with_bf16=False), outw)
    print("fixtures written to", os.path.abspath(ROOT))


if __name__ == "__main__":
    main()
