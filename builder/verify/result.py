"""The vocabulary of verification, shared by every scope: a test's result, the text matchers and
the package verdict. Imports nothing from the runners."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..plan import Test


@dataclass
class Result:
    test: Test
    status: str  # passed | failed | skipped | not-run
    message: str = ""
    seconds: float = 0.0
    output: str = ""

    def to_json(self) -> dict[str, Any]:
        t = self.test
        return {"name": t.name, "layer": t.layer, "scope": t.scope, "kind": t.kind, "status": self.status,
                "message": self.message, "seconds": round(self.seconds, 3), "output": self.output[-4000:],
                "requires": list(t.requires), "definition": f"{t.file}:{t.line or '?'}"}


def match_text(spec: dict[str, Any] | None, text: str, what: str) -> str:
    """'' when the text satisfies the matcher, else why not."""
    if not spec:
        return ""
    for s in spec.get("contains") or []:
        if s not in text:
            return f"{what} does not contain {s!r}"
    for s in spec.get("not-contains") or []:
        if s in text:
            return f"{what} contains {s!r}"
    if spec.get("matches") and not re.search(spec["matches"], text, re.M):
        return f"{what} does not match {spec['matches']!r}"
    if spec.get("equals") is not None and text.strip() != spec["equals"].strip():
        return f"{what} is {text.strip()[:200]!r}, expected {spec['equals']!r}"
    return ""


def package_query(name: str) -> str:
    return f"dpkg-query -W -f='${{Status}} ${{Version}}' {name}"


def judge_package(spec: dict[str, Any], code: int, out: str) -> str:
    """The verdict on package_query's output (in a container or a booted VM)."""
    installed = code == 0 and "install ok installed" in out
    if spec.get("installed", True) != installed:
        return f"{spec['name']} is {'installed' if installed else 'not installed'}"
    if installed and spec.get("version") and not out.endswith(" " + spec["version"]):
        return f"{spec['name']} is {out.split()[-1]}, expected {spec['version']}"
    return ""
