"""push, export packer, export oci and import oci: the commands that hand a built image on."""

from __future__ import annotations

from pathlib import Path

from .. import publish
from ..errors import UsageError
from ..escaping import for_terminal
from ..export import oci, packer
from .invocation import Invocation


def push(inv: Invocation) -> int:
    registry = publish.registry_for(inv.tree, inv.config, inv.args.registry)
    images = [(b.plan.image, b.plan.tags) for b in map(inv.built, inv.images)]
    for p in publish.push(inv.client, images, registry):
        print(f"{p.image:<20} {p.tag}  {p.digest}")
    return 0


def export_packer(inv: Invocation) -> int:
    built = inv.built()
    out = packer.export(inv.tree, inv.image, built.config, built.sets, Path(inv.args.dir))
    print(f"wrote {out}; run: packer build {out}")
    return 0


def export_oci(inv: Invocation) -> int:
    plan = inv.built().plan
    digest = oci.export(inv.client, plan.tags[0], plan.base.epoch, Path(inv.args.dir), project=inv.tree.root)
    print(for_terminal(f"{plan.tags[0]} {digest} -> {inv.args.dir}"))
    return 0


def import_oci(inv: Invocation) -> int:
    if not inv.args.registry:
        raise UsageError("no registry: give --registry HOST:PORT")
    print(oci.import_layout(Path(inv.args.dir), inv.args.registry, inv.args.repository))
    return 0
