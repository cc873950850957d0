#!/usr/bin/env python3
"""mini-swe-agent (PyPI `mini-swe-agent`, its own agent loop and `bash` tool) on the bundled
demo repository, talking to `frognano serve` through litellm as any OpenAI-compatible server.
Run by scripts/mini-swe-agent-demo.sh, which starts the server.

  python scripts/mini_swe_agent_demo.py --url http://127.0.0.1:PORT/v1 --model NAME
      [--steps 12] [--seed 1] [--tool-choice auto|required] [--out DIR]

Prints one line per model call (the command it ran, or the format error mini-swe-agent
answered with), then a JSON summary: calls, turns with a valid tool call, format errors,
exit status, and whether `python3 -m unittest test_stats` passes afterwards.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import yaml  # noqa: E402  (comes with mini-swe-agent)
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_path  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEMO = ROOT / "crates" / "agent" / "demo"


def demo_repo(dest: pathlib.Path) -> pathlib.Path:
    """The demo repository as `frognano solve --demo` makes it: its files, one commit."""
    repo = dest / "repo"
    shutil.copytree(DEMO / "repo", repo)
    git = ["git", "-C", str(repo), "-c", "user.name=demo", "-c", "user.email=demo@example.com"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "demo"], check=True)
    return repo


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tool-choice", default="auto", choices=["auto", "required"])
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="mswea-demo-"))
    repo = demo_repo(work)
    config = yaml.safe_load(get_config_path("mini").read_text())
    agent_cfg = dict(config["agent"], step_limit=a.steps, cost_limit=0)
    model_kwargs = {
        "api_base": a.url,
        "api_key": "none",
        "temperature": 0.7,
        "seed": a.seed,
        "max_tokens": a.max_tokens,
    }
    if a.tool_choice == "required":
        model_kwargs["tool_choice"] = "required"
    model = LitellmModel(model_name=f"openai/{a.model}", model_kwargs=model_kwargs, cost_tracking="ignore_errors")
    env = LocalEnvironment(cwd=str(repo), timeout=60)
    out = pathlib.Path(a.out) if a.out else work / "trajectory.json"
    agent = DefaultAgent(model, env, **dict(agent_cfg, output_path=out))
    try:
        result = agent.run(DEMO.joinpath("ISSUE.md").read_text())
    except Exception as e:  # a protocol error surfaces here
        result = {"exit_status": f"exception: {type(e).__name__}: {e}"}

    # A reply whose tool call did not parse never becomes an assistant message: mini-swe-agent
    # answers it with a FormatError user message and keeps the raw reply inside that.
    valid = format_errors = 0
    for m in agent.messages:
        if m.get("role") == "assistant":
            actions = m.get("extra", {}).get("actions", [])
            valid += bool(actions)
            for act in actions:
                print(f"  call {valid}: bash: {act['command'].splitlines()[0][:100]}")
        elif m.get("role") == "user" and m.get("extra", {}).get("interrupt_type") == "FormatError":
            format_errors += 1
            print(f"  format error: {m['content'].splitlines()[0][:100]}")
    calls = valid + format_errors
    tests = subprocess.run(["python3", "-m", "unittest", "test_stats"], cwd=repo, capture_output=True, text=True)
    diff = subprocess.run(["git", "-C", str(repo), "diff"], capture_output=True, text=True).stdout
    summary = {
        "model": a.model,
        "seed": a.seed,
        "tool_choice": a.tool_choice,
        "model_calls": calls,
        "turns_with_valid_tool_call": valid,
        "format_errors": format_errors,
        "exit_status": result.get("exit_status", ""),
        "tests_pass": tests.returncode == 0,
        "changed": bool(diff.strip()),
        "trajectory": str(out),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
