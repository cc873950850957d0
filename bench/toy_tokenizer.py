"""Writes a word-level tokenizer of the toy's vocabulary (crates/rl/src/toy.rs, VOCAB) into a
checkpoint folder, for servers that load one with the model (bench/tinker_e2e.sh)."""

import json
import re
import sys

from tokenizers import Tokenizer, models, pre_tokenizers

ROOT = __file__.rsplit("/bench/", 1)[0]
source = open(f"{ROOT}/crates/rl/src/toy.rs").read()
body = source.split("pub const VOCAB: [&str; ", 1)[1].split("] = [", 1)[1].split("];", 1)[0]
vocab = [json.loads(f'"{w}"') for w in re.findall(r'"((?:[^"\\]|\\.)*)"', body)]
folder = sys.argv[1]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.save(f"{folder}/tokenizer.json")
with open(f"{folder}/tokenizer_config.json", "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": vocab[0]}, f)
print(f"tokenizer of {len(vocab)} words written to {folder}")
