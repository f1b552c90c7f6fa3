"""Stage 2: compose an image: its parent's plan, its layers in dependency order, parameters, each
layer's contributions through the table of contribution kinds, the tests, and a content key per step.
The result is a frozen, JSON-serialisable BuildPlan."""

from __future__ import annotations

from typing import Any

from .. import lockfile
from ..checks.registry import check
from ..definitions.load import Config, Image, Layer, Tree
from ..definitions.tables import UNJUDGED
from ..errors import Collector
from ..plan import PLAN_FORMAT, Base, BuildPlan, LayerStep, Test, Value, digest
from . import contributions, phases
from .apply import apply_script, install_lines
from .graph import resolve
from .params import Setting, check_sets_used, format_sets, resolve_params
from .prebuild import check_prebuild
from .render import environment, render_string, render_tree
from .scope import LayerScope, Merged
from .tests import RENDERED_VALUE, TEXT_REMEDY, derived_boot_tests, is_false, make_test, one_line, text_problem

EPOCH_CHECK = check("image/source-date-epoch", "compose",
                    "an image bootstrapped from Debian needs a fixed source-date-epoch (bit-identical bases)",
                    "add e.g. source-date-epoch: 1700000000 (seconds since 1970; bases are then bit-identical)")
PARENT_CHECK = check("image/parent", "compose",
                     "an image built on another image names an existing image of the same kind, without a cycle",
                     "fix from.image")
Memo = dict[tuple[str, str | None, str], BuildPlan]
DEFAULT_SITE = {"gpu": {"model": "none", "count": 0, "memory-mib": 0}, "fabric": "none",
                "power-limit-watts": 0, "registry": None}


def _base(image: Image, out: Collector, parent: BuildPlan | None) -> Base:
    epoch = image.data.get("source-date-epoch")
    frm = image.data["from"]
    if "debian" in frm:
        if epoch is None:
            EPOCH_CHECK.report(out, image.file, image.line(), "source-date-epoch",
                               "an image bootstrapped from Debian needs a fixed source-date-epoch")
            epoch = 0
        deb = dict(frm["debian"])
        key = digest({"bootstrap": "mmdebstrap", "host-files": "dropped", "debian": deb, "epoch": epoch})
        return Base("debian", key, deb, None, epoch)
    assert parent is not None
    return Base("image", parent.key, None, parent.image, parent.base.epoch if epoch is None else epoch)


def _parent_plan(tree: Tree, image: Image, config_ref: str | None, sets: list[tuple[str, str, Any]] | None,
                 stack: tuple[str, ...], out: Collector, memo: Memo | None) -> BuildPlan | None:
    if "image" not in image.data["from"]:
        return None
    pname = image.data["from"]["image"]
    where = (image.file, image.line("from", "image"), "from.image")
    if pname == image.name or pname in stack:
        PARENT_CHECK.report(out, *where, "image dependency cycle: " + " -> ".join([*stack, image.name, pname]),
                            "an image cannot be built from itself")
        out.raise_if_any()
    if pname not in tree.images:
        PARENT_CHECK.report(out, *where, f"no image named {pname!r}", "images: " + ", ".join(sorted(tree.images)))
        out.raise_if_any()
    parent = compose(tree, pname, config_ref, sets, (*stack, image.name), memo)
    if tree.images[pname].data["kind"] != image.data["kind"]:
        PARENT_CHECK.report(out, image.file, image.line("kind"), "kind",
                            f"expected kind {tree.images[pname].data['kind']!r} like parent image {pname!r}, "
                            f"found {image.data['kind']!r}", "a node image builds on a node image")
    return parent


def check_asserts(layer: Layer, ctx: dict[str, Any], out: Collector) -> None:
    """A layer's `asserts`: conditions on parameter values, checked before anything is built."""
    env = environment(layer.dir / "files")
    for i, a in enumerate(layer.data["asserts"]):
        line = layer.line("asserts", i)
        that = render_string(env, a["that"], ctx, out, layer.file, line, f"asserts[{i}].that")
        if that is None or not is_false(that):
            continue
        message = render_string(env, a["message"], ctx, out, layer.file, line, f"asserts[{i}].message")
        remedy = render_string(env, a["remedy"], ctx, out, layer.file, line, f"asserts[{i}].remedy")
        for key, text in (("message", message), ("remedy", remedy)):
            why = text_problem((text or "").strip())  # printed as one line of an error, on a terminal
            if why:
                RENDERED_VALUE.report(out, layer.file, layer.line("asserts", i, key), f"asserts[{i}].{key}", why,
                                     TEXT_REMEDY)
                message = remedy = None
        out.add(layer.file, line, f"asserts.{a['name']}", message or a["name"], remedy or "", f"assert/{a['name']}")


def layer_step(s: LayerScope) -> tuple[LayerStep | None, dict[str, Any], list[Test]]:
    """One layer's step (its key set later, by compose.phases): every contribution kind read in
    table order, then its scripts and tests; and what its lock entry and wheels put into the package
    phase's key. A layer with problems yields no step (compose raises after all layers)."""
    before = len(s.out.problems)
    contributions.read_layer(s)
    if len(s.out.problems) > before:
        return None, {}, []
    apply, install = apply_script(s), install_lines(s)
    tests = []
    for i, t in enumerate(s.data["tests"]):
        test = make_test(s.render(t, "tests", i), s.name, s.layer.file, s.line("tests", i), f"tests[{i}]", s.out,
                         UNJUDGED)
        if test:
            tests.append(test)
    c = s.carry
    package_inputs: dict[str, Any] = {"locked": lockfile.entry(s.locked, s.name)}
    if c["wheels"]:
        package_inputs["wheels"] = {"requirements": c["wheels"], "target": c["wheel_target"],
                                    "locked": c["locked_wheels"]}
    step = LayerStep(s.name, s.data["summary"], "", tuple(s.files), apply, tuple(c["env"]),
                     tuple(c["pinned"]), c["locked"], tuple(c["wheels"]),
                     tuple(c["entrypoint"]) if c["entrypoint"] is not None else None, install)
    return step, package_inputs, tests


def _image_level(tree: Tree, image: Image, ictx: dict[str, Any], merged: Merged, out: Collector) -> list[Test]:
    """The image's own env, labels and tests, on top of its layers'."""
    env = environment(tree.root / "images")
    source = f"image {image.name} ({image.file})"
    for k, v in render_tree(env, image.data["env"], ictx, out, image.file, image.line("env"), "env").items():
        if v is not None and one_line(out, image.file, image.line("env", k), f"env.{k}", str(v)):
            merged.scalar("env", k, Value(str(v), source), image.file, image.line("env", k))
    for k, v in render_tree(env, image.data["labels"], ictx, out, image.file, image.line("labels"),
                            "labels").items():
        if v is not None and one_line(out, image.file, image.line("labels", k), f"labels.{k}", str(v)):
            merged.table("labels")[k] = Value(str(v), f"image {image.name}")
    tests = []
    for i, t in enumerate(render_tree(env, image.data["tests"], ictx, out, image.file, image.line("tests"),
                                      "tests")):
        test = make_test(t, f"image:{image.name}", image.file, image.line("tests", i), f"tests[{i}]", out, UNJUDGED)
        if test:
            tests.append(test)
    return tests


def _site(config: Config | None) -> dict[str, Any]:
    return (config.data["site"] if config else None) or DEFAULT_SITE


def _layers(tree: Tree, image: Image, config: Config | None, parent: BuildPlan | None, out: Collector,
            sets: list[tuple[str, str, Any]]) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, dict[str, Setting]]]:
    inherited = parent.inherited_layers + tuple(s.layer for s in parent.steps) if parent else ()
    extra = tuple(config.data["layers"][image.data["kind"]]) if config else ()
    order = resolve(tree, image, inherited, out, extra, config).order
    out.raise_if_any()
    settings = resolve_params(tree, order, image, config, sets, out)
    out.raise_if_any()
    return inherited, order, settings


def compose(tree: Tree, image_ref: str, config_ref: str | None = None,
            sets: list[tuple[str, str, Any]] | None = None, _stack: tuple[str, ...] = (),
            memo: Memo | None = None) -> BuildPlan:
    """The plan of one image with one config. memo: plans already composed with the same tree,
    config and sets (validate composes every image, and every image composes its parents)."""
    image = tree.image(image_ref)
    key = (image.name, config_ref, repr(sets or []))
    plan = memo.get(key) if memo is not None else None
    if plan is None:
        plan = _compose(tree, image, config_ref, sets, _stack, memo)
        if memo is not None:
            memo[key] = plan
    if not _stack and sets:  # the image asked for, not a parent composed for it (sets reach the parents too)
        check_sets_used(sets, image.name, (*plan.inherited_layers, *(s.layer for s in plan.steps)),
                        _descendant_layers(tree, image, config_ref))
    return plan


def _descendant_layers(tree: Tree, image: Image, config_ref: str | None) -> set[str]:
    """The layers (with what they require) of the images built on this one: a build composes an
    image's parents with the --set values meant for the image itself."""
    config = tree.config(config_ref)
    names: set[str] = set()
    for other in tree.images.values():
        seen, frm = {other.name}, other.data["from"].get("image")
        while frm and frm != image.name and frm not in seen and frm in tree.images:
            seen.add(frm)
            frm = tree.images[frm].data["from"].get("image")
        if frm == image.name:
            names |= {n for n, _, _ in other.layer_refs}
            names |= set(config.data["layers"][other.data["kind"]]) if config else set()
    pending = list(names)
    while pending:
        layer = tree.layers.get(pending.pop())
        for req in layer.data["requires"] if layer else ():
            if req not in names:
                names.add(req)
                pending.append(req)
    return names


def _compose(tree: Tree, image: Image, config_ref: str | None, sets: list[tuple[str, str, Any]] | None,
             _stack: tuple[str, ...], memo: Memo | None) -> BuildPlan:
    config, out = tree.config(config_ref), Collector()
    parent = _parent_plan(tree, image, config_ref, sets, _stack, out, memo)
    base = _base(image, out, parent)
    inherited, order, settings = _layers(tree, image, config, parent, out, sets or [])
    merged = Merged(out)
    if parent:
        contributions.inherit(merged, parent)
    all_params = {n: {p: s.value for p, s in ps.items()} for n, ps in settings.items()}
    ictx = {"params": all_params, "site": _site(config),
            "image": {"name": image.name, "kind": image.data["kind"], "version": image.data["version"]}}
    locked = lockfile.read(tree.root, image.name)
    unkeyed: list[tuple[LayerStep, dict[str, Any]]] = []
    tests: list[Test] = []
    for name in order:
        ctx = {**all_params[name], **ictx}
        check_asserts(tree.layers[name], ctx, out)
        scope = LayerScope(tree.layers[name], ctx, settings[name], merged, locked)
        step, package_inputs, layer_tests = layer_step(scope)
        if step is not None:
            unkeyed.append((step, package_inputs))
            tests.extend(layer_tests)
    install, steps = phases.assign_keys(base.key, unkeyed, image.data["kind"] == "node")
    if image.data["kind"] == "node":
        tests += derived_boot_tests(merged, tests)
    tests += _image_level(tree, image, ictx, merged, out)
    if not out.problems:  # what the build would reject later, said now
        check_prebuild(image, merged, locked, parent, out)
    out.raise_if_any()
    tags = tuple(image.data["outputs"]["tags"]) or (f"nodeforge/{image.name}:{image.data['version']}",)
    params = {f"{n}.{p}": Value(s.value, s.source) for n, ps in settings.items() for p, s in ps.items()}
    return BuildPlan(
        format=PLAN_FORMAT, image=image.name, kind=image.data["kind"], version=image.data["version"],
        summary=image.data["summary"], config=config.name if config else None, base=base, steps=tuple(steps),
        tags=tags, params={**parent.params, **params} if parent else params,
        tests=(*parent.tests, *tests) if parent else tuple(tests), outputs=dict(image.data["outputs"]),
        inherited_layers=inherited, user=image.data.get("user"), sets=format_sets(sets or []), install=install,
        **contributions.plan_fields(merged))
