#!/usr/bin/env python3
"""Grader-parity corpus for frognano-swe, graded by the official swebench==5.0.2 functions.

Runs the fixture test suites in scripts/swe_parity_fixtures/ through swebench-shaped eval
scripts (real pytest, unittest (Django's runner shape), cargo test, a sympy-format runner;
jest, vitest, mocha, node --test, googletest, doctest and mvn where installed), adds
hand-written logs for every porting trap of docs/grading.md §7.1 and for the
formats of tools not available here (each case's `source` says which), and
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
from types import SimpleNamespace

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

# Every registered parser except the pure aliases of a Python parser (checked by the Rust unit
# tests), run on every log of the corpus.
ALIASES = {
    "parse_log_astroid", "parse_log_flask", "parse_log_marshmallow", "parse_log_pvlib", "parse_log_pyvista",
    "parse_log_sqlfluff", "parse_log_xarray", "parse_log_pydicom", "parse_log_requests", "parse_log_pylint",
    "parse_log_astropy", "parse_log_scikit", "parse_log_sphinx",
}
RAW_PARSERS = [p for p in PARSER_REGISTRY if p not in ALIASES]
# Parsers that read the TestSpec: run again with these (instance_id, version) pairs; the key
# in golden.json is "<parser>#<instance_id>#<version>". Without a spec they raise.
SPEC_VARIANTS = {
    "parse_log_next": [("p__next-1", "1.27"), ("p__next-1", "1.0")],
    "parse_log_lighthouse": [("p__lh-1", "9.5"), ("p__lh-1", "4.0"), ("p__lh-1", "2.0"), ("p__lh-1", "x")],
    "parse_log_immutable_js": [("p__imm-2006", "1"), ("p__imm-2005", "1"), ("p__imm-7", "1")],
    "parse_log_jekyll": [("jekyll__jekyll-9141", "1"), ("jekyll__jekyll-8761", "1"), ("jekyll__jekyll-1", "1"), ("nodash", "1")],
}


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


def instance_for(name, parser, script, f2p, p2p, eval_type="pass_and_fail", spec=None):
    inst_id, version = spec or (f"parity__{name}-1", "1.0")
    return {
        "instance_id": inst_id,
        "repo": "parity/fixture",
        "version": version,
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


JS_CACHE = ROOT / ".venv-swe" / "js"


def js_modules():
    """node_modules for jsproj (jest, vitest, mocha at the versions of its package.json),
    installed once into the git-ignored venv folder."""
    if not (JS_CACHE / "node_modules" / ".bin" / "jest").exists():
        JS_CACHE.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / "jsproj" / "package.json", JS_CACHE / "package.json")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=JS_CACHE, check=True)
    return JS_CACHE / "node_modules"


def real_logs_other():
    """Real runs of non-Python test tools present on this machine (node, g++ with googletest
    and doctest, mvn). Returns {name: (bytes, parser, script, spec, label)}."""
    logs = {}
    work = Path(tempfile.mkdtemp(prefix="swe-parity-other-"))
    env = {"CI": "1", "NO_COLOR": "1", "FORCE_COLOR": "0"}

    def run(name, proj, cmd, parser, label, spec=None, extra_env=None):
        log, script = run_real(name, work / proj, cmd, {**env, **(extra_env or {})})
        logs[name] = (log.replace(str(work).encode(), b"/work"), parser, script, spec, label)

    for d in ["jsproj", "cproj", "javaproj"]:
        shutil.copytree(FIXTURES / d, work / d)
    if shutil.which("node") and shutil.which("npm"):
        (work / "jsproj" / "node_modules").symlink_to(js_modules())
        jest = "./node_modules/.bin/jest --ci"
        run("js_jest_verbose", "jsproj", f"{jest} --verbose jest/", "parse_log_jest", "real: jest 29.7.0 --verbose")
        run("js_jest_default", "jsproj", f"{jest} jest/", "parse_log_carbon", "real: jest 29.7.0 default reporter")
        run("js_jest_calypso", "jsproj", f"{jest} --verbose jest/calc.test.js", "parse_log_calypso", "real: jest 29.7.0")
        run(
            "js_jest_json",
            "jsproj",
            f"{jest} --json jest/ 2>/dev/null | node jest_json_lines.js",
            "parse_log_jest_json",
            "real: jest 29.7.0 --json, through jsproj/jest_json_lines.js (our stand-in for JEST_JSON_JQ_TRANSFORM)",
        )
        run(
            "js_vitest_verbose",
            "jsproj",
            "./node_modules/.bin/vitest run --reporter=verbose vitest/",
            "parse_log_vitest",
            "real: vitest 1.6.1 --reporter=verbose",
        )
        run("js_mocha_spec", "jsproj", "./node_modules/.bin/mocha mocha/spec.js", "parse_log_highlightjs",
            "real: mocha 10.8.2 spec reporter")
        run("js_mocha_json_prism", "jsproj", "./node_modules/.bin/mocha tests/run.js --reporter json",
            "parse_log_prismjs", "real: mocha 10.8.2 --reporter json (prismjs' command)")
        run("js_mocha_json_lighthouse", "jsproj", "./node_modules/.bin/mocha --reporter json", "parse_log_lighthouse",
            "real: mocha 10.8.2 --reporter json (lighthouse < 3.0 command)", spec=("p__lh-1", "2.0"))
        run("js_node_test_tap", "jsproj", "node --test --test-reporter=tap tap/", "parse_log_tap",
            "real: node --test --test-reporter=tap (TAP 13)")
    if shutil.which("g++") and Path("/usr/include/gtest/gtest.h").exists():
        run("c_googletest", "cproj", "g++ -std=c++17 -o gt gtest_calc.cpp -lgtest -lgtest_main -pthread && ./gt",
            "parse_log_googletest", "real: googletest 1.12 (Debian libgtest-dev)")
    if shutil.which("g++") and Path("/usr/include/doctest/doctest.h").exists():
        run("c_doctest_xml", "cproj", "g++ -std=c++17 -o dt doctest_calc.cpp && ./dt -s -r=xml", "parse_log_doctest",
            "real: doctest (Debian doctest-dev) -s -r=xml")
    if shutil.which("mvn"):
        cmd = "\n".join(
            [
                "mvn -B -o validate -Dtest=CalcTest#adds",
                "mvn -B -o test -Dtest=CalcTest#subtracts",
                "mvn -B -o validate -Dtest=OtherTest",
            ]
        )
        run("java_maven", "javaproj", cmd, "parse_log_maven",
            "real: mvn 3 offline (validate succeeds, test fails resolving plugins): real BUILD lines")
    shutil.rmtree(work, ignore_errors=True)
    return logs


def handwritten_other():
    """Logs in the exact formats the other parsers read, written by hand where the tool (a
    browser, redis, jq, micropython, ant, gradle, php, ruby) is not available here.
    Returns {name: (bytes, parser, spec, label)}."""
    h = {}

    def add(name, body, parser, spec=None, exit_code=0):
        h[name] = (wrap(body, exit_code), parser, spec, "hand-written in the tool's log format")

    add("hw_karma", "Starting browser ChromeHeadless\n  suite A\n    \u2714 passes one\n    \u2716 fails one\n"
        "    nested\n      \u2714 deep pass\n  suite B\n    \u2714 passes two\nSUMMARY:\n\u2714 4 tests\n  \u2714 after\n",
        "parse_log_karma", exit_code=1)
    add("hw_karma_pop_empty", "Starting browser Chrome\n  a\n b\n   c\n  d\n b\n", "parse_log_karma")
    add("hw_chart_js", "\x1b[32mChrome 120.0.6099.109 (Linux x86_64) Scale ticks should round FAILED\x1b[0m\n"
        "Chrome 120.0.6099.109 (Linux x86_64) Core.helpers\tnested FAILED\nChrome 120 (Linux x86_64)\nx FAILED\n",
        "parse_log_chart_js", exit_code=1)
    add("hw_bpmn_js", "\x1b[2KPhantomJS 2.1.1 (Linux 0.0.0) Modeler should import FAILED\n"
        "\x1b[2KPhantomJS 2.1.1 (Linux x86_64) Viewer should render FAILED\n"
        "Chrome Headless 120.0 (Linux x86_64) features/copy-paste should copy FAILED\n"
        "HeadlessChrome 0.0.0 (Linux 0.0.0) draw should draw FAILED\n", "parse_log_bpmn_js", exit_code=1)
    add("hw_openlayers", "Chrome Headless 120.0.0 (Linux x86_64_64) ol.Map renders FAILED\n"
        "Chrome 120.0.0 (Linux x86_64) ol.View fits FAILED\n  1) ol/source/Tile\n       loads   tiles:\n"
        "     Error: boom\ncase rendering-image: mismatch\n", "parse_log_openlayers", exit_code=1)
    add("hw_grommet", "PASS src/js/components/Button/__tests__/Button-test.js (5.123 s)\n"
        "FAIL src/js/components/Box/__tests__/Box-test.js\nPASS src/x.js (12 ms)\nFAIL\nnext line\n",
        "parse_log_grommet", exit_code=1)
    add("hw_next_v1", "+ xvfb-run yarn test\n xvfb-run karma\nStarting browser Chrome\n  Button\n"
        "    \u2713 renders\n    \u2717 clicks\n    Group\n      \u2713 nested ok\nERROR x\n  in y\n"
        "AssertionError:   # expected\nmore\n\n    \u2713 after assertion\nTOTAL: 1 FAILED, 2 SUCCESS\n  \u2713 ignored\n",
        "parse_log_next", spec=("p__next-1", "1.0"), exit_code=1)
    add("hw_next_v2", "Running:  button.spec.js)\n\n\n  Button\n    \u2713 renders (12ms)\n    1) clicks\n"
        "Running:  other.spec.js)\n\n\n  Other\n    \u2713 works (1ms)\n", "parse_log_next",
        spec=("p__next-1", "1.27"), exit_code=1)
    add("hw_quarto", "[smoke] > quarto render /tmp/abc123.qmd ... \x1b[32mok\x1b[39m (120ms)\n"
        "[unit] > yaml intelligence ... \x1b[31mFAILED\x1b[39m (3ms)\n[smoke] > render /tmp/xyz9/ out ... 32mok\n"
        "[smoke] > render /tmp/abc123.qmd again ... \x1b[32mok\x1b[39m\n[unit] > no status ...\n"
        "[unit] > steps ... passed 1 failed 0 steps\n[unit] 34mINFO x\ntest result: [smoke] 32mok\n"
        "ERRORS\n[unit] > after errors ... 32mok\n", "parse_log_quarto_cli", exit_code=1)
    add("hw_lighthouse_mocha", "running 2 test files\n  core\n    \u2714 loads (12ms)\n    \u2714 plain\n"
        "    1) audits (3ms)\n  other\n    2) breaks\n  2 passing (1s)\n  1) core\n    more\n",
        "parse_log_lighthouse", spec=("p__lh-1", "9.5"), exit_code=1)
    add("hw_calypso_crash", " ./node_modules/.bin/jest \n  suite\n    \u2713 test (12ms) trailing\n",
        "parse_log_calypso")
    add("hw_prismjs_bad_json", "+ ./node_modules/.bin/mocha tests/run.js --reporter json\n{ not json }\n",
        "parse_log_prismjs")
    add("hw_prismjs_no_key", "+ ./node_modules/.bin/mocha tests/run.js --reporter json\n{\"passes\": []}\n",
        "parse_log_prismjs")
    add("hw_doctest_malformed", "<doctest binary=\"x\"><TestCase name=\"a\"></doctest>\n", "parse_log_doctest")
    add("hw_marked", "  1 passing\n1) Marked Code spans should work\n 2) indented\n3)no space\n10) Lists nested  \n",
        "parse_log_marked", exit_code=1)
    add("hw_vitest", " \u2713 src/a.test.ts > adds 12ms\n \u00d7 src/a.test.ts > subs 3 ms\n"
        " \u2193 src/a.test.ts > later [skipped]\n \u2713 src/a.test.ts > no timing\n\u2713 tight\n",
        "parse_log_vitest", exit_code=1)
    add("hw_tap", "TAP version 13\nok 1 - adds\nnot ok 2 - subs\n  ok 3 indented sub\nok 4 # SKIP\nok five\n",
        "parse_log_tap", exit_code=1)
    add("hw_redis", "[ok]: SET and GET (2 ms)\n[err]: EXPIRE works in tests/unit/expire.tcl\n[skip]: slow test\n"
        "[ignore]: ignored one\n[ok]: name with (parens) (1 ms)\n  [ok]: indented\n[ok]:nospace\n",
        "parse_log_redis", exit_code=1)
    add("hw_jq", "PASS: tests/jq.test:12\nFAIL: tests/onig.test\n  PASS: indented\nPASS:nospace\n", "parse_log_jq",
        exit_code=1)
    add("hw_micropython", "pass  basics/int.py\nFAIL  basics/bad.py\nskip  extmod/x.py\npass\tbasics/tab.py\n",
        "parse_log_micropython_test", exit_code=1)
    add("hw_ant", "    [junit] [PASS] lombok.TestX.testA\n    [junit] [FAIL] lombok.TestX.testB\n"
        " [junit] [ERR] lombok.TestY\n[junit] [SKIP] z\n", "parse_log_ant", exit_code=1)
    add("hw_gradle", "org.Foo > testA PASSED\norg.Foo > testB FAILED\norg.Foo > testC\nWARNING: something\n"
        "PASSED\n> Task :test\nFAILED\norg.Bar > testD\nFAILED\n", "parse_log_gradle_custom", exit_code=1)
    add("hw_phpunit", " \u2714 before any suite\nCalculator (Tests\\Calculator)\n \u2714 Adds numbers\n"
        " \u2718 Subtracts numbers\n \u21a9 Skipped one\nOther (Tests\\Other)\n \u2714 Works\n",
        "parse_log_phpunit", exit_code=1)
    add("hw_minitest", "TestSite#test_render = 0.01 s = .\ntest_a. time = 0.01 s = .\ntest_b. t = 0.02 s = F\n"
        "test_c. t=E\n", "parse_log_minitest", spec=("jekyll__jekyll-9141", "1"), exit_code=1)
    add("hw_cucumber", "Scenario: builds site .....\nScenario: fails ...F\nno dots here\n", "parse_log_cucumber",
        exit_code=1)
    add("hw_ruby_unit", "test_add(TestCalc): .\ntest: test_sub(TestCalc): F\ntest_omit(TestCalc): O\n"
        "test_err(TestCalc): E (0.1s)\ntest_word(TestCalc): Ex\n", "parse_log_ruby_unit", exit_code=1)
    add("hw_rspec", "Calc adds - passed\nCalc subtracts - failed\nCalc pending - pending\n - passed\n",
        "parse_log_rspec_transformed_json", exit_code=1)
    return h


def pairs(m):
    return [[k, v] for k, v in m.items()]


def guarded(fn):
    try:
        return fn()
    except Exception as e:  # a grader exception is an expected outcome: no report.json
        return {"error": f"{type(e).__name__}: {e}"}


def variants(name, parser, script, status_map, spec=None):
    keys = list(status_map)
    failing = [k for k in keys if status_map[k] not in ("PASSED", "XFAIL")]
    passing = [k for k in keys if status_map[k] in ("PASSED", "XFAIL")]
    truncated = [k[: k.index("[") + 3] for k in keys if "[" in k][:3]
    out = [
        ("mixed", instance_for(name, parser, script, failing + ["tests/absent.py::nope"], passing, spec=spec)),
        ("passing_only", instance_for(name, parser, script, passing[:4], passing[4:], spec=spec)),
        ("fail_only", instance_for(name, parser, script, keys[:3], keys[3:], "fail_only", spec=spec)),
    ]
    if truncated:
        out.append(("truncated", instance_for(name, parser, script, truncated, [], spec=spec)))
    if len(passing) >= 2 and failing:
        out.append(
            ("partial", instance_for(name, parser, script, passing[:1] + failing[:1], passing[1:2], spec=spec))
        )
    return out


def grade_case(name, log_path, parser, script, spec=None):
    text = guarded(lambda: open(log_path).read())
    case = {"name": name, "log": log_path.name, "parser": parser, "raw": {}, "instances": []}
    if isinstance(text, str):
        runs = [(p, p, None) for p in RAW_PARSERS]
        runs += [(f"{p}#{i}#{v}", p, SimpleNamespace(instance_id=i, version=v)) for p, vs in SPEC_VARIANTS.items() for i, v in vs]
        for key, p, ns in runs:
            case["raw"][key] = {
                "whole": guarded(lambda: pairs(PARSER_REGISTRY[p](text, ns))),
                "slice": guarded(
                    lambda: pairs(PARSER_REGISTRY[p](text.split(START)[1].split(END)[0], ns))
                )
                if START in text
                else None,
            }
        case["exit_code"] = parse_test_exit_code(text)
        case["classify"] = list(classify_text(text) or []) or None
    else:
        case["read_error"] = text["error"]
    base = make_test_spec(instance_for(name, parser, script, [], [], spec=spec))
    base_map = guarded(lambda: get_logs_eval(base, str(log_path))[0])
    if isinstance(base_map, dict) and "error" in base_map and len(base_map) == 1:
        base_map = {}
    for variant, inst in variants(name, parser, script, base_map, spec):
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
    default_script = eval_script_for("/testbed", "pytest -rA")
    entries = {name: (log, None, default_script) for name, log in synthetic_logs().items()}
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
    labels = {}
    for name, (log, _p, script) in list(entries.items()):
        entries[name] = (log, default_parser.get(name, "parse_log_pytest"), script, None)
        labels[name] = "hand-written trap"
    for name, (log, parser, script) in real_logs().items():
        entries[name] = (log, parser, script, None)
        labels[name] = "real: Python/cargo run"
    for name, (log, parser, script, spec, label) in real_logs_other().items():
        entries[name] = (log, parser, script, spec)
        labels[name] = label
    for name, (log, parser, spec, label) in handwritten_other().items():
        entries[name] = (log, parser, default_script, spec)
        labels[name] = label
    for name, (log, parser, script, spec) in sorted(entries.items()):
        path = OUT / "logs" / f"{name}.log"
        path.write_bytes(log)
        case = grade_case(name, path, parser, script, spec)
        case["source"] = labels[name]
        cases.append(case)
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
