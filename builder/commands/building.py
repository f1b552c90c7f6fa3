"""build: the same build with nothing changed answers from its done record (builder.done) without
importing the engine client or the pipeline; any other build runs the pipeline (commands.build)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import done
from ..errors import UsageError
from ..plan import FORMATS
from .invocation import Invocation


def formats(value: str | None) -> list[str] | None:
    """--format: the node outputs of this build only (None: the image's outputs.formats)."""
    if value is None:
        return None
    chosen = list(dict.fromkeys(f.strip() for f in value.split(",") if f.strip()))
    if not chosen or not set(chosen) <= set(FORMATS):
        raise UsageError(f"--format: expected a comma-separated list of {', '.join(FORMATS)}; found {value!r}")
    return chosen


def record_key(inv: Invocation) -> str | None:
    """The done record's name for this invocation, or None where the fast path cannot see through."""
    from .. import lockfile
    from ..compose.image import Memo, compose
    from ..compose.variants import as_built
    from ..engine.labels import git_revision, git_source

    a = inv.args
    memo: Memo = {}
    plans = [compose(inv.tree, ref, inv.config, inv.sets, memo=memo) for ref in a.images]
    if not done.eligible(plans):  # a lock pins too little: the build composes with what it kept under build/resolved/
        kept = lockfile.kept_resolutions(inv.tree.root)
        plans = [as_built(inv.tree, p.image, inv.config, inv.sets, memo, kept) for p in plans]
        if not done.eligible(plans):
            return None
    root = inv.tree.root
    return done.key(root, [p.image for p in plans], plans, inv.config, list(a.set or []), formats(a.format),
                    git_revision(root), git_source(root))


def build(inv: Invocation) -> int:
    a = inv.args
    # no record stands for these: secrets are checked before the tree is read; a build that signs for
    # its fleet cache pushes what the cache lacks, one that requires it reaches it
    if a.secret or a.offline or a.mirror or a.cache_required or os.environ.get("NODEFORGE_FLEET_SIGNING_KEY"):
        from .build import build_with_engine

        return build_with_engine(inv, formats(a.format))
    key = record_key(inv)
    summary = done.replay(inv.tree.root, key) if key and not inv.args.locked else None
    if summary is not None:
        if not inv.args.quiet:
            shown = done.path_for(inv.tree.root, key or "")
            where = shown.relative_to(Path.cwd()) if shown.is_relative_to(Path.cwd()) else shown
            print(f"nothing changed since the build recorded in {where}: every tag and output checked, "
                  "no engine step", file=sys.stderr)
        print("\n".join(summary))
        return 0
    from .build import build_with_engine

    # no key: a lock pinned too little before this build resolved it; composed again once it has
    return build_with_engine(inv, formats(inv.args.format), key if key else lambda: record_key(inv))
