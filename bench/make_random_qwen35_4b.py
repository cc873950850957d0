#!/usr/bin/env python3
"""Random weights in the real Qwen3.5-4B text shapes (docs/model.md §1.2), bf16, HF layout, plus
the Qwen3.5 tokenizer if it was built (models/qwen35-tokenizer). Usage: OUT_DIR."""
import json, os, shutil, sys

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

out = sys.argv[1]
if os.path.exists(os.path.join(out, "config.json")):
    print("exists:", out)
    sys.exit(0)
torch.manual_seed(0)
cfg = Qwen3_5TextConfig(
    vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
    num_attention_heads=16, num_key_value_heads=4, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 8,
    rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    eos_token_id=248044)
with torch.device("cpu"):
    model = Qwen3_5ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty_like(p, dtype=torch.float32).uniform_(1.0, 16.0).log())
        elif p.ndim == 2:
            p.normal_(0.0, 0.02)
model.save_pretrained(out, max_shard_size="2GB")
tok = os.path.join(os.path.dirname(__file__), "..", "models", "qwen35-tokenizer")
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if os.path.exists(os.path.join(tok, f)):
        shutil.copy(os.path.join(tok, f), out)
print("written:", out)
