"""Reference outputs from llama.cpp (llama-cpp-python 0.3.36) for FrogNano's GGUF tests.

1. fixtures/smollm2/llama_cpp_reference.json — for several prompts on the demo model
   (SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch-demo-model.sh): the prompt token ids
   (llama.cpp's tokenizer), llama.cpp's argmax at every prompt position, the largest logit
   difference between the prompt in one batch and one token at a time,
   the top-64 logits of the last prompt position, and the first 16 greedy tokens (one token per
   decode call).
2. fixtures/qwen35-tiny.gguf and fixtures/qwen35-tiny-bf16.gguf — the tiny random Qwen3.5
   checkpoints converted by the converter that ships with llama.cpp
   (vendor/llama.cpp/convert_hf_to_gguf.py from the llama-cpp-python sdist, `--no-mtp`), and
   fixtures/qwen35-tiny-mtp.gguf, the f32 one converted with its MTP head.
   The tiny checkpoints carry a small BPE tokenizer whose pre-tokenizer hash the converter does
   not know, so this script passes the converter's own name for the Qwen3.5 regex (`qwen35`)
   through the documented escape hatch for unknown hashes, and adds the `architectures` entry
   that save_pretrained would have written to config.json (see `convert_qwen35` below).

Run with the venv built by scripts/setup-llama-reference.sh (which also keeps the
llama-cpp-python sdist in .venv-llama/sdist); the Qwen3.5 conversion runs llama.cpp's converter
with the transformers venv of scripts/setup-torch-reference.sh (CONVERT_PYTHON overrides it):
    .venv-llama/bin/python scripts/llama_reference.py [--skip-smollm2] [--skip-qwen35]
llama.cpp here was built with -DGGML_NATIVE=ON and the AMX instructions disabled (the AMX
path crashes on this CPU; docs/peers.md).
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
# The converter imports torch and transformers: run it with the transformers venv.
REF_VENV = os.environ.get("FROGNANO_REF_VENV", os.path.join(ROOT, ".venv-ref-torch"))
CONVERT_PYTHON = os.environ.get("CONVERT_PYTHON", os.path.join(REF_VENV, "bin", "python"))
# Where scripts/setup-llama-reference.sh put the sdist, and where it is unpacked.
SDIST_TARS = os.path.join(ROOT, ".venv-llama", "sdist")
SDIST_DIR = os.environ.get("LLAMA_SDIST_DIR", os.path.join(ROOT, ".venv-llama", "src"))

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4, 5, 6,",
]
N_GREEDY = 16
TOP_K = 64


def smollm2():
    from llama_cpp import Llama

    llm = Llama(model_path=MODEL, n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False, seed=0)
    cases = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
        argmax = scores.argmax(-1).tolist()
        top2 = np.sort(scores, axis=-1)[:, -2:]
        margin = [round(float(a - b), 4) for b, a in top2]
        # llama.cpp's own one-token-at-a-time path over the same prompt: how far its logits move
        # from the batch's (the bar of the default-kernel test).
        llm.reset()
        for t in ids:
            llm.eval([t])
        single = np.array(llm.scores[: len(ids)], dtype=np.float32)
        llm.reset()
        llm.eval(ids)
        last = scores[-1]
        top = np.argsort(-last)[:TOP_K]
        greedy, greedy_margin = [], []
        nxt = int(last.argmax())
        step_scores = last
        for _ in range(N_GREEDY):
            greedy.append(nxt)
            b, a = np.sort(step_scores)[-2:]
            greedy_margin.append(round(float(a - b), 4))
            llm.eval([nxt])
            step_scores = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            nxt = int(step_scores.argmax())
        cases.append({
            "prompt": text,
            "ids": ids,
            "argmax": argmax,
            "argmax_margin": margin,
            "batch_vs_single_max_abs": round(float(np.abs(scores - single).max()), 4),
            "last_top_ids": top.tolist(),
            "last_top_logits": [round(float(last[i]), 4) for i in top],
            "greedy": greedy,
            "greedy_margin": greedy_margin,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"),
        })
    out = os.path.join(ROOT, "fixtures", "smollm2", "llama_cpp_reference.json")
    import llama_cpp
    with open(out, "w") as f:
        json.dump({"model": os.path.basename(MODEL), "llama_cpp_python": llama_cpp.__version__,
                   "build": "GGML_NATIVE=ON, -mno-amx-tile -mno-amx-int8 -mno-amx-bf16; 2 threads; f16 KV cache",
                   "cases": cases}, f, indent=1)
        f.write("\n")
    print("wrote", out, file=sys.stderr)


def sdist_root():
    cand = glob.glob(os.path.join(SDIST_DIR, "llama_cpp_python-*"))
    if not cand:
        os.makedirs(SDIST_DIR, exist_ok=True)
        tars = glob.glob(os.path.join(SDIST_TARS, "llama_cpp_python-*.tar.gz"))
        if not tars:
            sys.exit("llama-cpp-python sdist not found; run scripts/setup-llama-reference.sh")
        with tarfile.open(tars[0]) as t:
            t.extractall(SDIST_DIR)
        cand = glob.glob(os.path.join(SDIST_DIR, "llama_cpp_python-*"))
    return cand[0]


def convert_qwen35():
    if not os.access(CONVERT_PYTHON, os.X_OK):
        sys.exit(f"{CONVERT_PYTHON} missing: run scripts/setup-torch-reference.sh (or set CONVERT_PYTHON)")
    src = sdist_root()
    lcpp = os.path.join(src, "vendor", "llama.cpp")
    # The converter identifies a pre-tokenizer by hashing what the tokenizer makes of a test
    # text; the tiny fixture's tokenizer is not one it knows. Its documented fix is a line in
    # get_vocab_base_pre mapping the hash to a name; instead of editing the vendored file we
    # run it with that method wrapped: an unknown hash on these fixtures means `qwen35` (the
    # fixture tokenizer uses the Qwen3.5 regex, scripts/make_qwen35_fixtures.py).
    runner = f"""
import sys
sys.path.insert(0, {os.path.join(lcpp, 'gguf-py')!r})
sys.path.insert(0, {lcpp!r})
import convert_hf_to_gguf as c
from conversion.base import TextModel
orig = TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        return "qwen35"
TextModel.get_vocab_base_pre = pre
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
c.main()
"""
    # (fixture, out name, type, with the MTP head): the head is a shard of its own
    # (mtp.safetensors), which the converter reads as a model part when it is named like one;
    # without --no-mtp the converter appends it after the main layers (blk.6.nextn.*, blk.6.*).
    for name, out_name, outtype, mtp in [
        ("qwen35-tiny", "qwen35-tiny", "f32", False),
        ("qwen35-tiny-bf16", "qwen35-tiny-bf16", "bf16", False),
        ("qwen35-tiny", "qwen35-tiny-mtp", "f32", True),
    ]:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = os.path.join(tmp, name)
            shutil.copytree(os.path.join(ROOT, "fixtures", name), model_dir)
            head = os.path.join(model_dir, "mtp.safetensors")
            if os.path.exists(head):
                if mtp:
                    os.rename(head, os.path.join(model_dir, "model-mtp.safetensors"))
                else:
                    os.remove(head)
            for f in ["tokenizer.json", "tokenizer_config.json"]:  # bf16 copy shares the f32 tokenizer
                if not os.path.exists(os.path.join(model_dir, f)):
                    shutil.copy(os.path.join(ROOT, "fixtures", "qwen35-tiny", f), model_dir)
            # The fixture's config.json was written from a config object (no `architectures`
            # list, which save_pretrained would add); the converter picks its model class by it.
            cfg_path = os.path.join(model_dir, "config.json")
            with open(cfg_path) as fh:
                cfg = json.load(fh)
            cfg.setdefault("architectures", ["Qwen3_5ForCausalLM"])
            if mtp:
                cfg["mtp_num_hidden_layers"] = 1
            with open(cfg_path, "w") as fh:
                json.dump(cfg, fh, indent=2)
            out = os.path.join(ROOT, "fixtures", f"{out_name}.gguf")
            subprocess.run([CONVERT_PYTHON, "-c", runner, model_dir, "--outfile", out, "--outtype", outtype]
                           + ([] if mtp else ["--no-mtp"]), check=True)
            print("wrote", out, os.path.getsize(out), file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--skip-qwen35", action="store_true")
    a = ap.parse_args()
    if not a.skip_qwen35:
        convert_qwen35()
    if not a.skip_smollm2:
        smollm2()
