"""The nodeforge command line. Exit codes: 0 ok, 1 a build or a test failed, 2 usage, definition or
environment error (never a traceback)."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from .engine import cancel
from .errors import EXIT_FAIL, DefinitionError, NodeforgeError, UsageError


def _tree(args: argparse.Namespace) -> Any:
    from .definitions.load import load_tree

    return load_tree(Path(args.root))


def _root_for(image_arg: str, root: str | None) -> str:
    if root:
        return root
    p = Path(image_arg)
    if p.suffix in (".yaml", ".yml") and p.parent.name == "images":
        return str(p.parent.parent)
    return "."


def cmd_list_checks(args: argparse.Namespace) -> int:
    from .checks import rootfs  # noqa: F401  (registers the assembler's checks)
    from .checks.registry import listing
    from .compose import image  # noqa: F401  (registers composition's checks)

    asserts = []
    if (Path(args.root) / "layers").is_dir():
        try:
            tree = _tree(args)
        except NodeforgeError as e:  # the registry is listed all the same; the asserts need the tree
            print(e.render() + "\n(the layers' asserts are left out)", file=sys.stderr)
        else:
            asserts = [(layer.name, a["name"], a["message"], a["remedy"]) for layer in tree.layers.values()
                       for a in layer.data["asserts"]]
    print(listing(asserts))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .compose.image import compose

    if args.list_checks:
        return cmd_list_checks(args)
    tree = _tree(args)
    problems: list[Any] = []
    configs = [None, *tree.configs] if not args.config else [args.config]
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


def _sets(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    from .compose.params import parse_sets

    return parse_sets(args.set or [])


def cmd_plan(args: argparse.Namespace) -> int:
    from .compose.explain import explain
    from .compose.image import compose

    tree = _tree(args)
    plan = compose(tree, args.image, args.config, _sets(args))
    if args.json:
        print(json.dumps(plan.to_json(), indent=2, default=str))
    else:
        print(explain(plan, provenance=args.explain))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from .compose.image import compose
    from .engine.bootstrap import base_ref, mmdebstrap_command
    from .engine.dockerfile import render

    tree = _tree(args)
    plan = compose(tree, args.image, args.config, _sets(args))
    if plan.base.kind == "debian":
        hint = base_ref(plan.base)
        cmd = shlex.join(mmdebstrap_command(plan.base, Path("base.tar")))
        boot = ("#!/bin/sh\n# Recreates this image's base (bit-identical with the same SOURCE_DATE_EPOCH)\nset -e\n"
                f"SOURCE_DATE_EPOCH={plan.base.epoch} {cmd}\n"
                f"docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' "
                f"base.tar {shlex.quote(hint)}\n")
    else:
        parent = compose(tree, plan.base.image or "", args.config, _sets(args))
        hint, boot = parent.tags[0], ""
    render(plan, Path(args.dir), hint, boot, plan.labels, project=tree.root)
    print(f"wrote {args.dir}/Dockerfile ({len(plan.steps)} layers); build it with: "
          f"docker build {'--build-arg BASE=' + hint + ' ' if boot else ''}{args.dir}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from .mirror.commands import offline_mirror
    from .node.signing import load_secrets
    from .pipeline import Builder
    from .progress import Progress

    secrets = load_secrets(args.secret or [])  # checked before anything is built
    tree = _tree(args)
    with Progress(quiet=args.quiet, live=True) as progress:  # live status on a terminal, plain lines in logs
        builder = Builder(tree, args.config, _sets(args), progress, locked=args.locked, secrets=secrets,
                          formats=_formats(args.format), mirror=offline_mirror(args))
        results = builder.build(args.images, jobs=args.jobs)
    print("images:")
    for r in results:
        print(f"  {r.image:<20} {' '.join(r.tags):<40} {r.id[7:19]}  {r.size / 1e6:8.1f} MB")
        if r.node:
            for role in r.node.files:
                path = r.node.path(role)
                print(f"    {role:<8} {path}  ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def _formats(value: str | None) -> list[str] | None:
    formats = list(dict.fromkeys(f.strip() for f in (value or "").split(",") if f.strip()))
    if value is not None and (not formats or not set(formats) <= {"raw", "qcow2", "netboot"}):
        raise UsageError(f"--format: expected a comma-separated list of raw, qcow2, netboot; found {value!r}")
    return formats if value is not None else None


def cmd_lock(args: argparse.Namespace) -> int:
    from . import lockfile as lock
    from .pipeline import Builder
    from .progress import Progress

    tree = _tree(args)
    image = tree.image(args.image)
    current, fresh = Builder(tree, args.config, _sets(args), Progress()).resolve_lock(image.name)
    changes = lock.diff(current, fresh)
    if args.check:
        if changes:  # per package: old -> new version, and whether the new one is a security update
            print("\n".join(lock.drift(current, fresh)))
            return 1
        print(f"{image.name}: lock is current")
        return 0
    path = lock.write(tree.root, fresh)
    print("\n".join(changes) if changes else "no changes")
    print(f"wrote {path.relative_to(tree.root)}")
    return 0


def _built(args: argparse.Namespace, tree: Any, image_ref: str, command: str) -> tuple[Any, str | None, Any]:
    """(plan, config, sets) of the image built under the image's tag: the flags' plan when it matches
    the image's recorded key, the recorded one when no -c/--set was given, else exit 2 naming both."""
    from .engine import client as engine
    from .engine.recorded import built_plan, image_labels

    return built_plan(tree, image_ref, args.config, _sets(args), command,
                      lambda ref: image_labels(engine.client(), ref))


def cmd_test(args: argparse.Namespace) -> int:
    from .verify.run import run_tests

    tree = _tree(args)
    plan, _, _ = _built(args, tree, args.image, "test")
    report = Path(args.report)
    modes = _modes(args.boot_modes)
    return run_tests(plan, report, boot=args.boot or bool(args.boot_modes), tree=tree, boot_modes=modes)


def _modes(text: str | None) -> tuple[str, ...]:
    from .verify.boot import ALL_MODES, MODES

    if not text:
        return MODES
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        raise UsageError(f"--boot-modes: unknown mode {', '.join(bad) or '(none)'}; expected some of "
                         f"{','.join(ALL_MODES)}")
    return modes


def cmd_boot(args: argparse.Namespace) -> int:
    from .verify import boot

    tree = _tree(args)
    plan, _, _ = _built(args, tree, args.image, "boot")
    art = boot.artifacts_for(plan, tree)
    cmdline = f"{art.cmdline} {args.append}".strip() if args.append else None
    return boot.interactive(art, args.mode, cmdline)


def cmd_export(args: argparse.Namespace) -> int:
    from .export.packer import export

    tree = _tree(args)
    _, config, sets = _built(args, tree, args.image, "export packer")
    out = export(tree, args.image, config, sets, Path(args.dir))
    print(f"wrote {out}; run: packer build {out}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from . import publish
    from .engine import client as engine

    tree = _tree(args)
    registry = args.registry
    config = tree.config(args.config)
    if not registry and config and config.data.get("site"):
        registry = config.data["site"].get("registry")
    if not registry:
        raise NodeforgeError("no registry: give --registry HOST:PORT or set site.registry in the config")
    images = []
    for ref in args.images:
        plan, _, _ = _built(args, tree, ref, "push")
        images.append((plan.image, plan.tags))
    for p in publish.push(engine.client(), images, registry):
        print(f"{p.image:<20} {p.tag}  {p.digest}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .diff import report

    lines, changed = report(args.a, args.b, args.format, args.all)
    print("\n".join(lines))
    return 1 if changed else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .definitions.reference import document
    from .definitions.tables import CONFIG, IMAGE, LAYER, PARAM

    table = {"layer": LAYER, "image": IMAGE, "config": CONFIG, "param": PARAM}
    for name in (args.kind,) if args.kind else table:
        print(document(name, table[name]))
    return 0


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", "-c", default=None, help="configs/<name>.yaml (name or path)")
    sp.add_argument("--set", "-s", action="append", metavar="LAYER.PARAM=VALUE",
                    help="override a parameter (highest precedence); repeatable")


def _definition_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("validate", help="check every layer, image and config")
    sp.add_argument("--config", "-c", default=None)
    sp.add_argument("--list-checks", action="store_true",
                    help="list every named check (and each layer's asserts) with its doc and remedy")
    sp.set_defaults(func=cmd_validate, image_arg=None)

    sp = sub.add_parser("plan", help="show what an image will contain")
    sp.add_argument("image")
    _common(sp)
    sp.add_argument("--explain", action="store_true", help="say which layer, config or flag set every value")
    sp.add_argument("--json", action="store_true", help="print the frozen build plan as JSON")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("render", help="write a build context (Dockerfile and files) to DIR")
    sp.add_argument("image")
    sp.add_argument("dir")
    _common(sp)
    sp.set_defaults(func=cmd_render)

    sp = sub.add_parser("schema", help="print the reference of every definition key")
    sp.add_argument("kind", nargs="?", choices=["layer", "image", "config", "param"],
                    help="one definition (param: a layer parameter's keys, types and how values combine)")
    sp.set_defaults(func=cmd_schema)


def _build_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("build", help="build images (and the images they build on)")
    sp.add_argument("images", nargs="+")
    _common(sp)
    sp.add_argument("-j", "--jobs", type=int, default=1, help="independent images built at once")
    sp.add_argument("--locked", action="store_true", help="fail if package resolution would change the lock")
    sp.add_argument("--format", default=None, metavar="FORMATS",
                    help="node outputs for this build only, e.g. raw or qcow2,netboot (overrides outputs.formats)")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.add_argument("--secret", action="append", metavar="NAME=PATH", help="a secret read in place, never copied "
                    "into the image: module-signing=PEM with the key and certificate that sign DKMS modules")
    sp.set_defaults(func=cmd_build)
    from .mirror.commands import add_command
    add_command(sub, sp)

    sp = sub.add_parser("lock", help="resolve every package to an exact version into images/<name>.lock")
    sp.add_argument("image")
    _common(sp)
    sp.add_argument("--check", action="store_true", help="exit 1 with a diff if the lock is not current")
    sp.set_defaults(func=cmd_lock)

    sp = sub.add_parser("test", help="run an image's tests; JUnit XML and JSON reports")
    sp.add_argument("image")
    _common(sp)
    sp.add_argument("--report", default="build/reports", help="directory for the reports")
    sp.add_argument("--boot", action="store_true", help="also boot node images and run boot-scope tests")
    sp.add_argument("--boot-modes", default=None, metavar="MODES",
                    help="comma-separated: direct,uefi,bios,netboot (default: the three disk modes; "
                    "implies --boot)")
    sp.set_defaults(func=cmd_test)

    sp = sub.add_parser("boot", help="boot a node image's disk with the serial console on this terminal")
    sp.add_argument("image")
    _common(sp)
    sp.add_argument("--mode", choices=["direct", "uefi", "bios"], default="uefi", help="how the disk boots")
    sp.add_argument("--append", default="", help="extra kernel arguments (direct mode)")
    sp.set_defaults(func=cmd_boot)


def _publish_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("export", help="write the image's build for another builder")
    ex = sp.add_subparsers(dest="format", required=True)
    pk = ex.add_parser("packer", help="a Packer template (qemu builder) reproducing the node build")
    pk.add_argument("image")
    pk.add_argument("dir")
    _common(pk)
    pk.set_defaults(func=cmd_export)
    from .repro import add_commands
    add_commands(sub, ex)

    sp = sub.add_parser("push", help="push every tag of built images to an OCI registry; prints digests")
    sp.add_argument("images", nargs="+")
    _common(sp)
    sp.add_argument("--registry", "-r", default=None, help="HOST[:PORT][/PATH] (default: the config's site.registry)")
    sp.set_defaults(func=cmd_push)

    sp = sub.add_parser("diff", help="what changed between two built images or two rollout manifests (*.json: "
                        "no engine needed); exit 1 when they differ")
    sp.add_argument("a", help="image tag or id, or a manifest.json")
    sp.add_argument("b", help="image tag or id, or a manifest.json")
    sp.add_argument("--all", action="store_true", help="list every changed file")
    sp.add_argument("--format", choices=("text", "markdown"), default="text", help="markdown: for a review")
    sp.set_defaults(func=cmd_diff)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodeforge", description="Build, verify and publish GPU node images and "
                                "CUDA container base images from layered definitions.")
    p.add_argument("--root", default=None, help="project tree (default: from the image path, else .)")
    sub = p.add_subparsers(dest="command", required=True)
    _definition_commands(sub)
    _build_commands(sub)
    _publish_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    first = getattr(args, "image", None) or (getattr(args, "images", None) or [None])[0]
    args.root = _root_for(first, args.root) if first else (args.root or ".")
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    try:
        with cancel.on_signals():  # Ctrl-C and SIGTERM stop the build
            return int(args.func(args))
    except NodeforgeError as e:
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        client_module = sys.modules.get("builder.engine.client")  # the containers this process created
        return cancel.interrupted(client_module.remove_throwaway_containers if client_module else list)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        return _fault(e)


def _fault(e: Exception) -> int:
    """An engine call that failed (exit 2, naming the call and the engine), a full disk (exit 1); else a bug."""
    client_module = sys.modules.get("builder.engine.client")  # loaded wherever the engine was spoken to
    problem = client_module.engine_problem(e) if client_module else None
    if problem is not None:
        print(problem.render(), file=sys.stderr)
        return int(problem.exit_code)
    if not isinstance(e, OSError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise e
    where = f" writing {e.filename}" if e.filename else ""
    print(f"error: no space left on the device{where}: nothing was published as complete (partial "
          "outputs were removed); free space (docker system prune, build/) and run it again", file=sys.stderr)
    return EXIT_FAIL

if __name__ == "__main__":
    sys.exit(main())
