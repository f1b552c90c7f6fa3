"""The command line of air-gapped builds: `nodeforge mirror IMAGE... DIR` and the `--offline`
and `--mirror DIR` flags of `build`. Light at import time: the work is imported when a command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError

Subparsers = argparse._SubParsersAction


def cmd_mirror(args: argparse.Namespace) -> int:
    from ..compose.params import parse_sets
    from ..definitions.load import load_tree
    from ..progress import Progress
    from .gather import mirror

    if not args.images[:-1]:
        raise UsageError("mirror: give one or more images and then the directory: nodeforge mirror IMAGE... DIR")
    tree = load_tree(Path(args.root))
    with Progress(quiet=args.quiet) as progress:
        index = mirror(tree, args.images[:-1], args.config, parse_sets(args.set or []), Path(args.images[-1]),
                       progress)
    debs = sum(1 for v in index.packages.values() for e in v.values() if "file" in e)
    print(f"{args.images[-1]}: {debs} packages, {sum(len(v) for v in index.wheels.values())} wheels, "
          f"{len(index.bases)} base(s) for {', '.join(sorted(index.images))}; build with: nodeforge build --offline "
          f"--mirror {args.images[-1]} IMAGE")
    return 0


def offline_mirror(args: argparse.Namespace) -> Path | None:
    """The mirror directory of an offline build (None for a build with the network); exit 2 for
    --offline without --mirror and the other way round."""
    if args.offline and not args.mirror:
        raise UsageError("--offline needs --mirror DIR: a directory made by `nodeforge mirror IMAGE... DIR`")
    if args.mirror and not args.offline:
        raise UsageError("--mirror DIR is for offline builds: add --offline")
    return Path(args.mirror) if args.mirror else None


def add_command(sub: Subparsers, build: argparse.ArgumentParser) -> None:
    """`mirror`, and build's --offline and --mirror."""
    build.add_argument("--offline", action="store_true", help="build with no network access at all, from --mirror")
    build.add_argument("--mirror", default=None, metavar="DIR", help="a directory made by `nodeforge mirror`, "
                       "checked against its index before anything is used")
    sp = sub.add_parser("mirror", help="the locked packages, wheels and bases of images in DIR, for offline builds")
    sp.add_argument("images", nargs="+", metavar="IMAGE... DIR")
    sp.add_argument("--config", "-c", default=None, help="configs/<name>.yaml (name or path)")
    sp.add_argument("--set", "-s", action="append", metavar="LAYER.PARAM=VALUE",
                    help="override a parameter (highest precedence); repeatable")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.set_defaults(func=cmd_mirror)
