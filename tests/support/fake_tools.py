"""Fake hardware tools for tests: a recorded scenario in, an environment and the call log out.

The fakes live in tests/fakes/bin (nvidia-smi, dcgmi, dmesg, scontrol, mstflint, ...): each is a link
to `replay`, which answers from the scenario directory named by FAKE_FIXTURE and appends every call to
FAKE_LOG. A test passes the fake's path to the program (`fake("nvidia-smi")`) and runs it with the
environment from `fake_tools`:

    env, calls = fake_tools(GPU / "h100-sxm-8gpu", tmp_path)
    proc = subprocess.run([sys.executable, SCRIPT, "--nvidia-smi", fake("nvidia-smi")], env=env, ...)
    assert calls.argv("nvidia-smi") == [["--query-gpu=...", ...]]

- `env` is os.environ (or `base`, e.g. {"PATH": "/usr/bin:/bin"} for a bare one) plus FAKE_FIXTURE,
  FAKE_LOG (tmp/calls.jsonl), FAKE_STATE (tmp/fake-state), PYTHONPATH (the node library, so that
  node programs import it from the source tree as they do from dist-packages on a node),
  PYTHONDONTWRITEBYTECODE (the work tree stays clean) and `extra`.
  For an in-process run, `for k, v in env.items(): monkeypatch.setenv(k, v)`.
- `calls` reads the log when asked, so it sees the calls of every run made after `fake_tools`:
  `calls()` is every call as {"tool": ..., "argv": [...]}, `calls("scontrol")` one tool's,
  `calls.argv(tool=None)` only the argument lists, `for c in calls` every call, `len(calls)` how
  many so far (to slice `calls.argv()[before:]` after a second run in the same directory).
- `program_env(base=None, **extra)` is the environment without fakes (PYTHONPATH only), for a node
  program run on recorded files.
- `merge(tmp, *scenarios)` is one scenario made of several (links, the first one's files win);
  `overlay(tmp, scenario, tool, rules, files)` is a copy of one with test rules answering first.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
FAKES = ROOT / "tests" / "fakes" / "bin"
NODE_LIB = ROOT / "layers" / "node-lib" / "files"


def fake(tool: str) -> str:
    """The path of a fake tool, as a program's --tool option takes it."""
    path = FAKES / tool
    if not path.exists():
        raise FileNotFoundError(f"no fake {tool!r} in {FAKES} (link it to replay)")
    return str(path)


class Calls:
    """The fakes' call log (one JSON object a line), read afresh on every question."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def __call__(self, tool: str | None = None) -> list[dict[str, Any]]:
        lines = self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []
        calls = [json.loads(line) for line in lines]
        return [c for c in calls if tool is None or c["tool"] == tool]

    def argv(self, tool: str | None = None) -> list[list[str]]:
        return [c["argv"] for c in self(tool)]

    def __len__(self) -> int:
        return len(self())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self())


def program_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """An environment in which a node program finds the node library (PYTHONPATH), without fakes."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(NODE_LIB), env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ beside the layers' files
    env.update(extra)
    return env


def fake_tools(scenario: Path, tmp: Path, base: Mapping[str, str] | None = None,
               **extra: str) -> tuple[dict[str, str], Calls]:
    """The environment that points the fakes at `scenario`, and the log of what they were asked."""
    if not scenario.is_dir():
        raise FileNotFoundError(f"no fake-tool scenario at {scenario}")
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "calls.jsonl"
    env = program_env(base, FAKE_FIXTURE=str(scenario), FAKE_LOG=str(log), FAKE_STATE=str(tmp / "fake-state"))
    env.update(extra)
    return env, Calls(log)


def merge(tmp: Path, *scenarios: Path, name: str = "scenario") -> Path:
    """One scenario from several, side by side as links; where two have a file, the first one's wins."""
    target = tmp / name
    target.mkdir(parents=True)
    for source in scenarios:
        for entry in source.iterdir():
            if not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    return target


def overlay(tmp: Path, scenario: Path, tool: str, rules: list[dict[str, Any]], files: Mapping[str, str]) -> Path:
    """A copy of `scenario` under tmp with `files` added and `rules` for `tool` answering first
    (<tool>.d/00-test.json sorts before the recorded rules). A second overlay adds to the copy."""
    target = tmp / scenario.name
    if not target.exists():
        shutil.copytree(scenario, target)
    for name, text in files.items():
        (target / name).write_text(text, encoding="utf-8")
    (target / f"{tool}.d").mkdir(exist_ok=True)
    (target / f"{tool}.d" / "00-test.json").write_text(json.dumps(rules), encoding="utf-8")
    return target
