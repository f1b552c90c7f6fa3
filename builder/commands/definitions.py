"""validate, plan, render and schema: the commands that read the definitions and build nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..checks import rootfs
from ..checks.registry import listing
from ..compose import image
from ..compose.compat import driver_warning
from ..compose.explain import explain
from ..compose.image import compose
from ..compose.variants import matrix as variants_document
from ..compose.variants import variants
from ..definitions.reference import document, layer
from ..definitions.tables import CONFIG, IMAGE, LAYER, PARAM
from ..engine.dockerfile import render as render_context
from ..errors import DefinitionError, NodeforgeError, UsageError
from .invocation import Invocation

CHECKED_BY = (image, rootfs)  # the stages whose named checks `validate --list-checks` lists (they declare them)
SCHEMAS = {"layer": LAYER, "image": IMAGE, "config": CONFIG, "param": PARAM}


def list_checks(inv: Invocation) -> int:
    asserts = []
    if (inv.root / "layers").is_dir():
        try:
            tree = inv.tree
        except NodeforgeError as e:  # the registry is listed all the same; the asserts need the tree
            print(e.render() + "\n(the layers' asserts are left out)", file=sys.stderr)
        else:
            asserts = [(layer.name, a["name"], a["message"], a["remedy"]) for layer in tree.layers.values()
                       for a in layer.data["asserts"]]
    print(listing(asserts))
    return 0


def validate(inv: Invocation) -> int:
    if inv.args.list_checks:
        return list_checks(inv)
    tree = inv.tree
    problems: list[Any] = []
    configs = [None, *tree.configs] if not inv.config else [inv.config]
    memo: dict[Any, Any] = {}
    for name in tree.images:
        for cfg in configs:
            try:
                compose(tree, name, cfg, [], memo=memo)
            except NodeforgeError as e:
                problems.extend(p for p in e.problems if p not in problems)
    if problems:
        raise DefinitionError(problems)
    print(f"ok: {len(tree.layers)} layers, {len(tree.images)} images, {len(tree.configs)} configs")
    return 0


def plan(inv: Invocation) -> int:
    p = compose(inv.tree, inv.image, inv.config, inv.sets)
    if warning := driver_warning(inv.tree, p, inv.config):
        print(f"plan: {warning}", file=sys.stderr)
    if inv.args.json:
        print(json.dumps(p.to_json(), indent=2, default=str))
    else:
        print(explain(p, provenance=inv.args.explain))
    return 0


def matrix(inv: Invocation) -> int:
    found = variants(inv.tree, inv.images, inv.args.configs, inv.sets)
    doc = variants_document(found)
    if inv.args.submit == "slurm":
        from ..slurm import submit

        doc["jobs"] = submit(found, inv.tree.root, inv.args.sbatch_arg or [])
    elif inv.args.sbatch_arg:
        raise UsageError("--sbatch-arg: only with --submit slurm")
    print(json.dumps(doc, indent=2))
    return 0


def render(inv: Invocation) -> int:
    p = compose(inv.tree, inv.image, inv.config, inv.sets)
    if p.base.kind == "debian":
        from ..engine.bootstrap import base_ref, recreate_script  # here: the engine client only for render

        hint, boot = base_ref(p.base), recreate_script(p.base)
    else:
        parent = compose(inv.tree, p.base.image or "", inv.config, inv.sets)
        hint, boot = parent.tags[0], ""
    render_context(p, Path(inv.args.dir), hint, boot, p.labels, project=inv.tree.root)
    print(f"wrote {inv.args.dir}/Dockerfile ({len(p.steps)} layers); build it with: "
          f"docker build {'--build-arg BASE=' + hint + ' ' if boot else ''}{inv.args.dir}")
    return 0


def schema(inv: Invocation) -> int:
    if inv.args.name:
        if inv.args.kind != "layer":
            raise UsageError(f"schema {inv.args.kind or ''} {inv.args.name}: a name goes after `layer` only "
                             "(nodeforge schema layer NAME)")
        print(layer(inv.tree, inv.args.name))
        return 0
    for name in (inv.args.kind,) if inv.args.kind else SCHEMAS:
        print(document(name, SCHEMAS[name]))
    return 0
