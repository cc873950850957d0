#!/usr/bin/env python3
"""Grader-parity corpus for frognano-swe, graded by the official swebench==5.0.2 functions.

Runs the fixture test suites in scripts/swe_parity_fixtures/ through swebench-shaped eval
scripts (real pytest, unittest (Django's runner shape), cargo test, a sympy-format runner),
adds hand-written logs for every porting trap of shared/docs/swe-bench.md section 7, and
records what swebench computes for each: raw parser maps, get_logs_eval, the exit code,
the tests report, the resolution, report.json text, infra classification, eval-script
rewriting, prediction loading and the run report. Output goes to
crates/swe/tests/parity/ (logs + golden.json); `cargo test -p frognano-swe --test parity`
then checks FrogNano against it without Python.

Usage: scripts/swe-parity.sh (sets up the venv, runs this, then the cargo test).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from swebench.harness.constants import EvalType
from swebench.harness.grading import (
    compute_fail_to_pass,
    compute_pass_to_pass,
    get_eval_report,
    get_eval_tests_report,
    get_logs_eval,
    get_resolution_status,
    parse_test_exit_code,
)
from swebench.harness.infra_failure import classify_text
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.reporting import make_run_report
from swebench.harness.utils import get_predictions_from_file, make_test_spec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "scripts" / "swe_parity_fixtures"
OUT = ROOT / "crates" / "swe" / "tests" / "parity"
START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"

# One function per distinct parser behaviour; aliases are checked by the Rust unit tests.
RAW_PARSERS = [
    "parse_log_pytest",
    "parse_log_pytest_options",
    "parse_log_pytest_v2",
    "parse_log_django",
    "parse_log_seaborn",
    "parse_log_sympy",
    "parse_log_matplotlib",
    "parse_log_cargo",
    "parse_log_gotest",
]


def eval_script_for(workdir: str, cmd: str) -> str:
    """A v5-style eval script (the dataset text, before swebench's rewriting)."""
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {workdir}",
            f": '{START}'",
            cmd,
            f": '{END}'",
            "echo done",
        ]
    )


def instance_for(name, parser, script, f2p, p2p, eval_type="pass_and_fail"):
    return {
        "instance_id": f"parity__{name}-1",
        "repo": "parity/fixture",
        "version": "1.0",
        "base_commit": "0" * 40,
        "image": "none",
        "eval_script": script,
        "log_parser": parser,
        "eval_type": eval_type,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": json.dumps(p2p),  # the HF string form, on purpose
    }


def run_real(name, workdir, cmd, env=None):
    """Runs a fixture suite through the rewritten eval script and returns the log bytes."""
    script = eval_script_for(workdir, cmd)
    spec = make_test_spec(instance_for(name, "parse_log_pytest", script, [], []))
    path = Path(tempfile.mkdtemp()) / "eval.sh"
    path.write_text(spec.eval_script)
    proc = subprocess.run(
        ["/bin/bash", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    return proc.stdout, script


def wrap(body: str, exit_code=0, tail="") -> bytes:
    return (
        f"+ cd /testbed\n+ : '{START}'\n{body}\n+ SWEBENCH_TEST_EXIT_CODE={exit_code}\n"
        f"+ : '{END}'\n+ echo '>>>>> Test Exit Code: {exit_code}'\n>>>>> Test Exit Code: {exit_code}\n{tail}"
    ).encode()


def synthetic_logs():
    """Hand-written logs, one per porting trap."""
    s = {}
    s["crlf_and_cr"] = wrap(
        "PASSED tests/a.py::test_one\r\nFAILED tests/a.py::test_two - assert 1\rPASSED tests/a.py::test_three\r\n",
        1,
    )
    s["info_separators_tabs"] = wrap(
        "PASSED\x1ctests/a.py::test_sep\x1f\nPASSED\ttests/a.py::test_tab\nFAILED tests/a.py::test_x\x1d-\x1e\n"
        "  test_sym\x1cok\n",
        1,
    )
    s["ansi_colours"] = wrap(
        "\x1b[32mPASSED\x1b[0m tests/a.py::test_green\n\x1b[1;31mFAILED\x1b[0m tests/a.py::test_red - boom\n"
        "tests/a.py::test_old_style \x1b[32mPASSED\x1b[0m\n",
        1,
    )
    s["progress_and_skip_summary"] = wrap(
        "tests/a.py::test_a PASSED [ 50%]\nPASSED [100%]\nSKIPPED [3] tests/a.py:10: no db\n"
        "SKIPPED tests/a.py::test_b\nPASSED tests/a.py::test_c\n"
    )
    s["duplicates"] = wrap(
        "PASSED tests/a.py::test_d\nFAILED tests/a.py::test_e\nFAILED tests/a.py::test_d\nPASSED tests/a.py::test_e\n",
        1,
    )
    s["truncated_ids"] = wrap(
        "PASSED tests/a.py::test_p[log(photon)-x]\nPASSED tests/a.py::test_p[log(photon)-y]\n"
        "PASSED tests/a.py::test_q[a(1)]\nFAILED tests/a.py::test_q[a(2)]\n",
        1,
    )
    s["two_start_markers"] = (
        f"+ : '{START}'\nPASSED tests/a.py::first\n+ : '{START}'\nPASSED tests/a.py::second\n+ : '{END}'\n".encode()
    )
    s["missing_end_marker"] = f"+ : '{START}'\nPASSED tests/a.py::x\n".encode()
    s["outside_markers"] = (
        f"PASSED tests/a.py::early\n+ : '{START}'\nnothing here\n+ : '{END}'\nFAILED tests/a.py::late\n".encode()
    )
    s["spoofed_pass"] = wrap("PASSED tests/a.py::test_fake\nPASSED tests/a.py::test_fake2\n", 1)
    s["nonzero_with_failure"] = wrap("PASSED tests/a.py::ok\nFAILED tests/a.py::bad\n", 2)
    s["lone_error_line"] = wrap("test_x (m.T.test_x) ... ok\nERROR:\n")
    s["lone_fail_word"] = wrap("FAIL:only\n")
    s["invalid_utf8"] = wrap("PASSED tests/a.py::ok\n") + b"\xff\xfe bad bytes\n"
    s["apply_failed"] = b">>>>> Patch Apply Failed\nerror: patch failed: a.py:1\n"
    s["timeout"] = wrap("PASSED tests/a.py::ok\n", 0, "\n\nTimeout error: 30 seconds exceeded.")
    s["killed_no_output"] = f"+ : '{START}'\nKilled\n+ : '{END}'\n".encode()
    s["module_missing"] = (
        f"+ : '{START}'\nModuleNotFoundError: No module named 'x'\n+ : '{END}'\n".encode()
    )
    s["jest_evidence_empty_map"] = f"+ : '{START}'\nTests:       3 passed, 3 total\n+ : '{END}'\n".encode()
    s["django_multiline"] = wrap(
        "test_a (m.T.test_a) ... Testing against Django installed in '/x'\nwith up to 8 processes\n"
        "System check identified no issues (0 silenced).\nok\n"
        "test_b (m.T.test_b) ... Internal Server Error: /admin/x/\nok\n"
        "test_c (m.T.test_c) ... System check identified no issues (0 silenced)\nok\n"
        "--version is equivalent to version\n"
        "Applying sites.0002_alter_domain_unique...test_no_migrations (m.T.test_no_migrations) ... ok\n"
        "test_d (m.T.test_d) ...  OK\ntest_e (m.T.test_e) ... skipped 'why'\nokay then\n"
    )
    s["sympy_headers"] = wrap(
        "test_alpha ok\ntest_beta F\ntest_gamma E\n____ sympy/core/tests/test_basic.py:test_beta ____\n"
        "__ sympy/core/tests/test_basic.py:test_gamma __ and more text.py:zz _\n",
        1,
    )
    s["gotest"] = wrap(
        "=== RUN   TestAdd\n--- PASS: TestAdd (0.00s)\n--- FAIL: TestSub (0.01s)\n"
        "    --- SKIP: TestSub/case_1 (0.00s)\n--- PASS: Test With Spaces (1.5s)\nFAIL\n",
        1,
    )
    s["cargo_variants"] = wrap(
        "test a::b ... ok\ntest a::c ... FAILED\ntest a::d ... ignored\ntest a::e ... ignored, slow\n"
        "  test\x1ca::f\x1c...\x1cok  \ntest a::g - should panic ... ok\n",
        1,
    )
    s["options_paths"] = wrap(
        "PASSED tests/t.py::test_p[/usr/lib/x/y.py]\nPASSED tests/t.py::test_p[//net/share]\n"
        "PASSED tests/t.py::test_p[/a/*]\nFAILED tests/t.py::test_p[a][b]extra - x\n"
        "PASSED tests/t.py::test_mb[MouseButton.LEFT]\n",
        1,
    )
    s["seaborn_shapes"] = wrap(
        "tests/t.py::test_a PASSED [10%]\ntests/t.py::test_b FAILED\nPASSED tests/t.py::test_c\n"
        "FAILED tests/t.py::test_d - boom\nx PASSED y\nSKIPPED tests/t.py::test_e\n",
        1,
    )
    s["unicode_ids"] = wrap("PASSED tests/t.py::test_é[ü-😀]\nFAILED tests/t.py::test_ß\n", 1)
    return s


def real_logs():
    """Runs the fixture suites; returns {name: (bytes, primary parser, dataset eval script)}."""
    logs = {}
    work = Path(tempfile.mkdtemp(prefix="swe-parity-"))
    for d in ["pyproj", "unitproj", "cargoproj", "sympyproj"]:
        shutil.copytree(FIXTURES / d, work / d)
    py = sys.executable
    pytest = f"{py} -m pytest -p no:cacheprovider"
    env = {"PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "100"}
    for name, cmd, parser in [
        ("pytest_ra", f"{pytest} -rA tests/test_mix.py", "parse_log_pytest"),
        ("pytest_options", f"{pytest} -rA tests/test_mix.py", "parse_log_pytest_options"),
        ("pytest_matplotlib", f"{pytest} -rA tests/test_mix.py", "parse_log_matplotlib"),
        (
            "pytest_astropy_classic",
            f"{pytest} -rA -vv -o console_output_style=classic --tb=no tests/test_mix.py",
            "parse_log_pytest_v2",
        ),
        ("pytest_colour_v2", f"{pytest} -rA -v --color=yes tests/test_mix.py", "parse_log_pytest_v2"),
        ("pytest_seaborn", f"{pytest} --no-header -rA tests/test_mix.py", "parse_log_seaborn"),
        ("pytest_crash", f"{pytest} -rA tests/test_crash.py", "parse_log_pytest"),
        ("pytest_no_tests", f"{pytest} -rA tests/test_absent.py", "parse_log_pytest"),
    ]:
        log, script = run_real(name, work / "pyproj", cmd, env)
        logs[name] = (log.replace(str(work).encode(), b"/work"), parser, script)
    log, script = run_real("django", work / "unitproj", f"{py} -m unittest -v test_suite", env)
    logs["unittest_django"] = (log.replace(str(work).encode(), b"/work"), "parse_log_django", script)
    log, script = run_real("sympy", work / "sympyproj", f"{py} bin_test.py test_things.py", env)
    logs["sympy_runner"] = (log.replace(str(work).encode(), b"/work"), "parse_log_sympy", script)
    if shutil.which("cargo"):
        log, script = run_real(
            "cargo",
            work / "cargoproj",
            "cargo test --offline --color never 2>&1",
            {"CARGO_TARGET_DIR": str(work / "target"), "CARGO_TERM_COLOR": "never"},
        )
        # Compile timings and hashes vary run to run; keep only stable lines.
        keep = [
            line
            for line in log.split(b"\n")
            if not line.strip().startswith((b"Compiling", b"Finished", b"Running", b"Locking", b"Adding"))
        ]
        logs["cargo_test"] = (b"\n".join(keep), "parse_log_cargo", script)
    if shutil.which("go"):
        print("note: go is installed but no go fixture is generated yet", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return logs


def pairs(m):
    return [[k, v] for k, v in m.items()]


def guarded(fn):
    try:
        return fn()
    except Exception as e:  # a grader exception is an expected outcome: no report.json
        return {"error": f"{type(e).__name__}: {e}"}


def variants(name, parser, script, status_map):
    keys = list(status_map)
    failing = [k for k in keys if status_map[k] not in ("PASSED", "XFAIL")]
    passing = [k for k in keys if status_map[k] in ("PASSED", "XFAIL")]
    truncated = [k[: k.index("[") + 3] for k in keys if "[" in k][:3]
    out = [
        ("mixed", instance_for(name, parser, script, failing + ["tests/absent.py::nope"], passing)),
        ("passing_only", instance_for(name, parser, script, passing[:4], passing[4:])),
        ("fail_only", instance_for(name, parser, script, keys[:3], keys[3:], "fail_only")),
    ]
    if truncated:
        out.append(("truncated", instance_for(name, parser, script, truncated, [])))
    if len(passing) >= 2 and failing:
        out.append(("partial", instance_for(name, parser, script, passing[:1] + failing[:1], passing[1:2])))
    return out


def grade_case(name, log_path, parser, script):
    text = guarded(lambda: open(log_path).read())
    case = {"name": name, "log": log_path.name, "parser": parser, "raw": {}, "instances": []}
    if isinstance(text, str):
        for p in RAW_PARSERS:
            case["raw"][p] = {
                "whole": guarded(lambda: pairs(PARSER_REGISTRY[p](text, None))),
                "slice": guarded(
                    lambda: pairs(PARSER_REGISTRY[p](text.split(START)[1].split(END)[0], None))
                )
                if START in text
                else None,
            }
        case["exit_code"] = parse_test_exit_code(text)
        case["classify"] = list(classify_text(text) or []) or None
    else:
        case["read_error"] = text["error"]
    base = make_test_spec(instance_for(name, parser, script, [], []))
    base_map = guarded(lambda: get_logs_eval(base, str(log_path))[0])
    if isinstance(base_map, dict) and "error" in base_map and len(base_map) == 1:
        base_map = {}
    for variant, inst in variants(name, parser, script, base_map):
        spec = make_test_spec(inst)
        expected = {"variant": variant, "instance": inst, "eval_script": spec.eval_script}
        le = guarded(lambda: get_logs_eval(spec, str(log_path)))
        if isinstance(le, tuple):
            expected["logs_eval"] = {"map": pairs(le[0]), "found": le[1]}
            if le[1]:
                rep = get_eval_tests_report(
                    le[0],
                    {"FAIL_TO_PASS": spec.FAIL_TO_PASS, "PASS_TO_PASS": spec.PASS_TO_PASS},
                    eval_type=EvalType(spec.eval_type),
                )
                expected["tests_report"] = rep
                expected["resolution"] = get_resolution_status(rep)
                expected["f2p"] = compute_fail_to_pass(rep)
                expected["p2p"] = compute_pass_to_pass(rep)
        else:
            expected["logs_eval"] = le
        for patch_name, patch in [("with_patch", "diff --git a/x b/x\n"), ("null_patch", None)]:
            pred = {"instance_id": inst["instance_id"], "model_name_or_path": "m", "model_patch": patch}
            rep = guarded(lambda: json.dumps(get_eval_report(spec, pred, str(log_path), True), indent=4))
            expected[f"report_{patch_name}"] = rep
        case["instances"].append(expected)
    return case


def predictions_cases(tmp: Path):
    preds = [
        {"instance_id": "a__b-1", "model_name_or_path": "org/model", "model_patch": "diff"},
        {"instance_id": "a__b-2", "model_name_or_path": "org/model", "model_patch": None},
        {"instance_id": "a__b-1", "model_name_or_path": "org/model", "model_patch": "later wins", "extra": 1},
    ]
    files = {
        "preds.jsonl": "\n".join(json.dumps(p) for p in preds) + "\n",
        "preds_list.json": json.dumps(preds),
        "preds_dict.json": json.dumps({f"k{i}": p for i, p in enumerate(preds)}),
        "bad_scalar.json": "3",
        "bad_entry.jsonl": json.dumps({"model_patch": "x"}) + "\n",
    }
    out = []
    for fname, content in files.items():
        (tmp / fname).write_text(content)
        got = guarded(lambda: get_predictions_from_file(str(tmp / fname), "x", "test"))
        out.append({"file": fname, "content": content, "result": got})
    return out


def run_report_case(tmp: Path):
    """Lays out reports like run_instance does, then runs make_run_report."""
    run_id = "parity-run"
    os.chdir(tmp)
    dataset = [{"instance_id": f"p__q-{i}"} for i in range(1, 7)]
    predictions = {
        "p__q-1": {"instance_id": "p__q-1", "model_name_or_path": "org/m", "model_patch": "d"},
        "p__q-2": {"instance_id": "p__q-2", "model_name_or_path": "org/m", "model_patch": "d"},
        "p__q-3": {"instance_id": "p__q-3", "model_name_or_path": "org/m", "model_patch": ""},
        "p__q-4": {"instance_id": "p__q-4", "model_name_or_path": "org/m", "model_patch": "d"},
        "p__q-5": {"instance_id": "p__q-5", "model_name_or_path": "org/m", "model_patch": "d"},
    }
    files = {
        "p__q-1/report.json": json.dumps({"p__q-1": {"resolved": True}}, indent=4),
        "p__q-2/report.json": json.dumps({"p__q-2": {"resolved": False}}, indent=4),
        "p__q-2/test_output.txt": "collected 0 items\n",
        "p__q-4/test_output.txt": "Killed\n",
        "p__q-5/report.json": "   ",
    }
    base = tmp / "logs" / "run_evaluation" / run_id / "org__m"
    for rel, content in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(content)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        path = make_run_report(predictions, dataset, run_id, client=None, report_dir=str(tmp / "out"))
    return {
        "run_id": run_id,
        "dataset": dataset,
        "predictions": list(predictions.values()),
        "files": files,
        "report_file": Path(path).name,
        "report_text": Path(path).read_text(),
    }


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "logs").mkdir(parents=True)
    cases = []
    entries = {name: (log, None, eval_script_for("/testbed", "pytest -rA")) for name, log in synthetic_logs().items()}
    default_parser = {
        "django_multiline": "parse_log_django",
        "lone_error_line": "parse_log_django",
        "lone_fail_word": "parse_log_django",
        "sympy_headers": "parse_log_sympy",
        "gotest": "parse_log_gotest",
        "cargo_variants": "parse_log_cargo",
        "options_paths": "parse_log_pytest_options",
        "seaborn_shapes": "parse_log_seaborn",
        "ansi_colours": "parse_log_pytest_v2",
        "info_separators_tabs": "parse_log_pytest_v2",
    }
    for name, (log, _p, script) in list(entries.items()):
        entries[name] = (log, default_parser.get(name, "parse_log_pytest"), script)
    for name, (log, parser, script) in real_logs().items():
        entries[name] = (log, parser, script)
    for name, (log, parser, script) in sorted(entries.items()):
        path = OUT / "logs" / f"{name}.log"
        path.write_bytes(log)
        cases.append(grade_case(name, path, parser, script))
    tmp = Path(tempfile.mkdtemp(prefix="swe-parity-run-"))
    golden = {
        "swebench_version": "5.0.2",
        "cases": cases,
        "predictions": predictions_cases(tmp),
        "run_report": run_report_case(tmp),
    }
    (OUT / "golden.json").write_text(json.dumps(golden, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
