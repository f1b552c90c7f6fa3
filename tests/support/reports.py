"""`nodeforge test --report` run from a test: the JSON report, with the command's exit status and
stderr, and the failures in it as lines to assert on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def report_of_test(cli: list[str], image: str, report: Path, *args: str) -> dict[str, Any]:
    """`CLI test IMAGE ARGS --report REPORT`: the report of image, with "rc" and "stderr" added."""
    proc = subprocess.run([*cli, "test", image, *args, "--report", str(report)], capture_output=True, text=True)
    data: dict[str, Any] = json.loads((report / f"{Path(image).stem}.json").read_text())
    data["rc"], data["stderr"] = proc.returncode, proc.stderr
    return data


def failures(report: dict[str, Any]) -> list[str]:
    """'layer: test: message' for every failed result of a report."""
    return [f"{r.get('layer')}: {r['name']}: {r.get('message')}" for r in report["results"] if r["status"] == "failed"]


def assert_all_passed(report: dict[str, Any]) -> None:
    """No result failed and the command said so (exit 0)."""
    failed = failures(report)
    assert not failed, failed
    assert report["rc"] == 0, report["stderr"][-3000:]
