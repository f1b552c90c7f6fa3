"""diff and repro: the commands that compare two builds."""

from __future__ import annotations

from ..compose.image import compose, output_name
from ..diff import diff_previous, report
from ..errors import UsageError
from ..manifest import document
from ..repro.twice import repro as twice
from .invocation import Invocation


def diff(inv: Invocation) -> int:
    if inv.args.previous:
        if inv.args.b is not None:
            raise UsageError("diff --previous: give one image (its last build against the one before it), not two")
        plan = compose(inv.tree, inv.image_name(inv.args.a), inv.config, inv.sets)
        lines, changed = diff_previous(document.path_for(inv.tree.root, output_name(plan)).parent, inv.args.format)
    elif inv.args.b is None or inv.config or inv.args.set:
        raise UsageError("diff: give two images or manifests (A B), or one image with --previous; -c/--set "
                         "go with --previous only")
    else:
        lines, changed = report(inv.args.a, inv.args.b, inv.args.format, inv.args.all)
    print("\n".join(lines))
    return 1 if changed else 0


def repro(inv: Invocation) -> int:
    return twice(inv.tree, inv.image_name(), inv.config, inv.args.set or [], inv.sets, keep=inv.args.keep,
                 diffoscope=not inv.args.no_diffoscope)
