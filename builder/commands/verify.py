"""test and boot: the commands that judge a built image."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..verify import boot as booting
from ..verify.boot import ALL_MODES, MODES
from ..verify.run import run_tests
from .invocation import Invocation


def boot_modes(text: str | None) -> tuple[str, ...]:
    if not text:
        return MODES
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        raise UsageError(f"--boot-modes: unknown mode {', '.join(bad) or '(none)'}; expected some of "
                         f"{','.join(ALL_MODES)}")
    return modes


def test(inv: Invocation) -> int:
    a = inv.args
    return run_tests(inv.built().plan, Path(a.report), boot=a.boot or bool(a.boot_modes), tree=inv.tree,
                     boot_modes=boot_modes(a.boot_modes))


def boot(inv: Invocation) -> int:
    art = booting.artifacts_for(inv.built().plan, inv.tree)
    cmdline = f"{art.cmdline} {inv.args.append}".strip() if inv.args.append else None
    return booting.interactive(art, inv.args.mode, cmdline)
