"""Boot time to verdict per boot mode: images/node-minimal.yaml (configs/default.yaml) booted with its
boot-scope checks, from power-on to the verdict on the serial console, and the guest's own
systemd-analyze figure; netboot boots the netboot artifacts over HTTP with the root in RAM.
`python benchmarks/boot.py [MODE...]` prints the table; run() returns rows."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (14, 8, 13, 7, 60)
sys.path.insert(0, str(ROOT))


def run(modes: tuple[str, ...] | None = None) -> list[tuple[object, ...]]:
    from builder.definitions.load import load_tree
    from builder.pipeline import Builder
    from builder.progress import Progress
    from builder.verify import boot

    tree = load_tree(ROOT)
    (result,) = Builder(tree, "default", [], Progress(quiet=True)).build(["node-minimal"])
    assert result.node is not None
    tests = [t for t in result.plan.tests if t.scope == "boot" and not t.requires]
    rows: list[tuple[object, ...]] = [("mode (accel)", "verdict", "to verdict s", "checks ok", "guest says")]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes or boot.ALL_MODES:
            o = boot.boot(result.node, mode, Path(tmp) / f"{mode}.log", tests=tests)
            ok = sum(1 for i, t in enumerate(tests) if i in o.report.probes
                     and not boot.guest.judge(t, *o.report.probes[i]))
            rows.append((f"{mode} ({o.accel})", o.verdict, f"{o.seconds:.1f}", f"{ok}/{len(tests)}",
                         o.report.boot_time.replace("Startup finished in ", "")[:60] or o.reason[:60]))
    return rows


if __name__ == "__main__":
    for row in run(tuple(sys.argv[1:]) or None):
        print("  ".join(f"{c!s:<16}" for c in row))
