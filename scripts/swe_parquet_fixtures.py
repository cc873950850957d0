#!/usr/bin/env python3
"""Writes the small parquet instance files that crates/swe/tests/parquet.rs reads.

They mirror the Hugging Face SWE-bench files: princeton-nlp/SWE-bench_Verified (every column a
string; FAIL_TO_PASS / PASS_TO_PASS JSON-encoded strings; `difficulty`), written the way
`datasets` writes them (pyarrow defaults: snappy, dictionary pages, data page v1), plus the
v5 fields (image, eval_script, log_parser, eval_type, nullable image_assets) and variants the
reader must also handle: real list<string> columns, nulls, several row groups and pages, data
page v2, no dictionary, no compression, legacy 2-level lists, ints and bools. One file has a
malformed row. A zstd file checks the error for codecs we do not read.

Usage: scripts/swe-parquet-fixtures.sh (creates the venv, runs this).
"""

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parent.parent / "crates" / "swe" / "tests" / "fixtures" / "parquet"

VERIFIED_COLUMNS = [
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
    "difficulty",
]


def row(i, repo="astropy/astropy"):
    owner, name = repo.split("/")
    return {
        "repo": repo,
        "instance_id": f"{owner}__{name}-{12907 + i}",
        "base_commit": f"{i:040x}",
        "patch": f"diff --git a/m{i}.py b/m{i}.py\n--- a/m{i}.py\n+++ b/m{i}.py\n@@ -1 +1 @@\n-x = {i}\n+x = {i + 1}\n",
        "test_patch": f"diff --git a/tests/test_m{i}.py b/tests/test_m{i}.py\n",
        "problem_statement": f"Issue {i}: ünïcode — 😀 and a\nsecond line",
        "hints_text": "" if i % 2 else f"hint {i}",
        "created_at": f"2022-03-0{i % 9 + 1}T18:34:15Z",
        "version": ["4.3", "3.0", "1.10"][i % 3],
        "FAIL_TO_PASS": [f"tests/test_m{i}.py::test_fix[{i}]"],
        "PASS_TO_PASS": [f"tests/test_m{i}.py::test_keep_{j}" for j in range(i % 3)],
        "environment_setup_commit": f"{i + 100:040x}",
        "difficulty": ["<15 min fix", "15 min - 1 hour", "1-4 hours"][i % 3],
    }


def verified_table(n):
    rows = [row(i, ["astropy/astropy", "django/django", "sympy/sympy"][i % 3]) for i in range(n)]
    cols = {c: [r[c] for r in rows] for c in VERIFIED_COLUMNS}
    cols["FAIL_TO_PASS"] = [json.dumps(v) for v in cols["FAIL_TO_PASS"]]
    cols["PASS_TO_PASS"] = [json.dumps(v) for v in cols["PASS_TO_PASS"]]
    return pa.table({c: pa.array(v, pa.string()) for c, v in cols.items()}), rows


def v5_table(n, list_type=pa.list_(pa.string())):
    rows = [row(i, "caddyserver/caddy") for i in range(n)]
    for i, r in enumerate(rows):
        r["image"] = f"swebench/sweb.eval.x86_64.caddyserver_1776_caddy-{12907 + i}:latest"
        r["eval_script"] = "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\ngo test ./...\n: '>>>>> End Test Output'\n"
        r["log_parser"] = "parse_log_gotest"
        r["eval_type"] = "fail_only" if i == 1 else "pass_and_fail"
        r["image_assets"] = None if i % 2 else json.dumps({"test_patch": [{"path": "a.png", "url": "https://x/a.png"}]})
        r["hints_text"] = None if i == 2 else r["hints_text"]
    fields = {}
    for c in VERIFIED_COLUMNS + ["image", "eval_script", "log_parser", "eval_type", "image_assets"]:
        vals = [r[c] for r in rows]
        fields[c] = pa.array(vals, list_type if c in ("FAIL_TO_PASS", "PASS_TO_PASS") else pa.string())
    fields["num_tests"] = pa.array([len(r["PASS_TO_PASS"]) if i != 3 else None for i, r in enumerate(rows)], pa.int64())
    fields["verified"] = pa.array([i % 2 == 0 for i in range(n)], pa.bool_())
    fields["score"] = pa.array([i / 4 for i in range(n)], pa.float64())
    return pa.table(fields), rows


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    # 1. The Verified layout, written by `datasets` itself (Dataset.to_parquet is the writer
    #    behind push_to_hub: snappy, dictionary, content-defined chunking, page index).
    t, _ = verified_table(6)
    datasets.Dataset(t).to_parquet(str(OUT / "verified.parquet"))
    # 2. v5 fields, list<string> test columns, nulls, several row groups and pages, page v2,
    #    no dictionary, no compression.
    t, _ = v5_table(7)
    pq.write_table(
        t,
        OUT / "v5_lists.parquet",
        row_group_size=3,
        data_page_size=64,
        use_dictionary=False,
        compression="none",
        data_page_version="2.0",
    )
    # 3. Same rows, snappy + dictionary + page v2 + legacy two-level lists.
    pq.write_table(
        t,
        OUT / "v5_legacy_lists.parquet",
        row_group_size=4,
        data_page_version="2.0",
        use_compliant_nested_type=False,
        write_statistics=False,
    )
    # 4. Malformed: row 2 has a FAIL_TO_PASS string that is not JSON; row 4 lacks instance_id.
    t, _ = verified_table(5)
    cols = {c: t.column(c).to_pylist() for c in t.column_names}
    cols["FAIL_TO_PASS"][2] = "[not json"
    cols["instance_id"][4] = None
    pq.write_table(pa.table({c: pa.array(v, pa.string()) for c, v in cols.items()}), OUT / "malformed.parquet")
    # 5. A codec the reader does not implement.
    t, _ = verified_table(2)
    pq.write_table(t, OUT / "zstd.parquet", compression="zstd")
    # Expected rows as JSON (what pandas would hand to SWE-bench), for the Rust test.
    expected = {}
    for f in ["verified", "v5_lists", "v5_legacy_lists"]:
        expected[f] = pq.read_table(OUT / f"{f}.parquet").to_pylist()
    (OUT / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1) + "\n")
    for p in sorted(OUT.glob("*.parquet")):
        meta = pq.read_metadata(p)
        codecs = {meta.row_group(0).column(j).compression for j in range(meta.num_columns)}
        print(f"{p.name}: {meta.num_rows} rows, {meta.num_row_groups} row groups, {p.stat().st_size} bytes, {codecs}")


if __name__ == "__main__":
    main()
