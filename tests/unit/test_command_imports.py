"""A command imports what it needs: the definition commands (validate, plan, schema, matrix) never load the
Docker SDK (and with it requests and urllib3), which is most of a command's start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_MODULES = ("docker", "requests", "urllib3", "builder.pipeline", "builder.engine.client")

PROBE = """
import contextlib, io, json, sys
from builder.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("docker", "requests",
      "urllib3") or m in ("builder.pipeline", "builder.engine.client"))}))
"""


def _loaded(*argv: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return out


@pytest.mark.parametrize("argv", [("validate",), ("plan", "images/node-minimal.yaml"),
                                  ("plan", "images/gpu-node.yaml", "--explain"), ("schema",),
                                  ("matrix", "images/gpu-node.yaml", "cuda-13.0-runtime")])
def test_a_definition_command_does_not_load_the_engine_client(argv: tuple[str, ...]) -> None:
    out = _loaded(*argv)
    assert out["rc"] == 0 and out["loaded"] == [], f"nodeforge {' '.join(argv)} loaded {out['loaded']}"


def test_the_probe_sees_the_engine_client_where_a_command_loads_it(tmp_path: Path) -> None:
    """The harness: render writes a Dockerfile with the base's engine name, and does load the client."""
    out = _loaded("render", "images/node-minimal.yaml", str(tmp_path / "ctx"))
    assert set(ENGINE_MODULES) & set(out["loaded"])
