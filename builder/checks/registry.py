"""The registry of named semantic checks (KIWI's runtime checker, bootc's lint registry).

Every check that `validate`, composition or the assembler runs has a name, a one-line doc and a
remedy; every problem it reports carries its name (`[name]` after the message), and
`nodeforge validate --list-checks` prints them all. A layer's `asserts` are checks too: they are
listed by layer under `assert/<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Collector


@dataclass(frozen=True)
class Check:
    name: str
    stage: str  # compose | assemble: when it runs
    doc: str  # one line: what it finds
    remedy: str  # what to do about it

    def report(self, out: Collector, file: str, line: int | None, path: str, message: str,
               remedy: str | None = None) -> None:
        out.add(file, line, path, message, self.remedy if remedy is None else remedy, self.name)


CHECKS: dict[str, Check] = {}
STAGES = ("compose", "assemble")  # in the order they run


def check(name: str, stage: str, doc: str, remedy: str) -> Check:
    """Register a named check; a name is registered once."""
    if stage not in STAGES:
        raise ValueError(f"check {name!r}: stage {stage!r} is not one of {STAGES}")
    if name in CHECKS:
        raise ValueError(f"check {name!r} registered twice")
    CHECKS[name] = Check(name, stage, doc, remedy)
    return CHECKS[name]


def listing(asserts: list[tuple[str, str, str, str]] | None = None) -> str:
    """The text of `validate --list-checks`: every registered check, then the layers' asserts
    given as (layer, name, message, remedy)."""
    lines = []
    for c in sorted(CHECKS.values(), key=lambda c: (STAGES.index(c.stage), c.name)):
        lines += [f"{c.name}  ({c.stage})", f"    {c.doc}", f"    fix: {c.remedy}"]
    for layer, name, message, remedy in sorted(asserts or []):
        lines += [f"assert/{name}  (compose, layer {layer})", f"    {message}", f"    fix: {remedy}"]
    return "\n".join(lines)
