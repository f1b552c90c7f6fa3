"""The reproducibility commands: `repro` (build twice in isolation, compare), `export oci` (a
normalised OCI layout, by reproducible digest) and `import oci` (a layout into a registry, by
digest, with skopeo). Light at import time: the work is imported when a command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

Subparsers = argparse._SubParsersAction


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", "-c", default=None, help="configs/<name>.yaml (name or path)")
    sp.add_argument("--set", "-s", action="append", metavar="LAYER.PARAM=VALUE",
                    help="override a parameter (highest precedence); repeatable")


def _tree_and_sets(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    from .compose.params import parse_sets
    from .definitions.load import load_tree

    return load_tree(Path(args.root)), parse_sets(args.set or [])


def _image_name(tree: Any, image: str) -> str:
    name = Path(image).stem if image.endswith((".yaml", ".yml")) else image
    if name not in tree.images:
        from .errors import UsageError

        raise UsageError(f"no image {name!r} in {tree.root / 'images'}")
    return name


def cmd_repro(args: argparse.Namespace) -> int:
    from .export.twice import repro

    tree, sets = _tree_and_sets(args)
    return repro(tree, _image_name(tree, args.image), args.config, args.set or [], sets, keep=args.keep,
                 diffoscope=not args.no_diffoscope)


def cmd_export_oci(args: argparse.Namespace) -> int:
    from .engine import client as engine
    from .engine.recorded import built_plan, image_labels
    from .escaping import for_terminal
    from .export import oci

    tree, sets = _tree_and_sets(args)
    c = engine.client()
    plan, _, _ = built_plan(tree, _image_name(tree, args.image), args.config, sets, "export oci",
                            lambda ref: image_labels(c, ref))
    digest = oci.export(c, plan.tags[0], plan.base.epoch, Path(args.dir), project=tree.root)
    print(for_terminal(f"{plan.tags[0]} {digest} -> {args.dir}"))
    return 0


def cmd_import_oci(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .export import oci

    if not args.registry:
        raise UsageError("no registry: give --registry HOST:PORT")
    print(oci.import_layout(Path(args.dir), args.registry, args.repository))
    return 0


def add_commands(sub: Subparsers, export_formats: Subparsers) -> None:
    """`export oci` (under `export`), `import oci` and `repro`."""
    sp = export_formats.add_parser("oci", help="a normalised OCI image layout (reproducible digest); prints "
                                   "the digest")
    sp.add_argument("image")
    sp.add_argument("dir")
    _common(sp)
    sp.set_defaults(func=cmd_export_oci)

    sp = sub.add_parser("import", help="copy an OCI layout into a registry by digest (skopeo)")
    formats = sp.add_subparsers(dest="format", required=True)
    im = formats.add_parser("oci", help="an OCI layout written by `nodeforge export oci`")
    im.add_argument("dir")
    im.add_argument("--registry", "-r", default=None, help="HOST[:PORT] (TLS is not verified for 127.0.0.1)")
    im.add_argument("--repository", default=None, help="repository in the registry (default: the exported name)")
    im.set_defaults(func=cmd_import_oci)

    sp = sub.add_parser("repro", help="build an image twice in isolation and compare (exit 0 identical, "
                        "1 different)")
    sp.add_argument("image")
    _common(sp)
    sp.add_argument("--keep", action="store_true",
                    help="keep both builds, their OCI layouts and namespaced engine tags")
    sp.add_argument("--no-diffoscope", action="store_true", help="the built-in comparison even where diffoscope "
                    "is installed")
    sp.set_defaults(func=cmd_repro)
