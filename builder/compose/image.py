"""Stage 2: compose an image: its parent's plan, its layers in dependency order, parameters, each
layer's contributions through the table of contribution kinds, the tests, and a content key per step.
The result is a frozen, JSON-serialisable BuildPlan."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import lockfile
from ..checks.registry import check
from ..debian import recipe
from ..definitions.load import Config, Image, Layer, Tree
from ..definitions.tables import UNJUDGED
from ..errors import Collector, DefinitionError
from ..plan import PLAN_FORMAT, Base, BuildPlan, LayerStep, Test, Value, digest
from . import contributions, cut, host_sources, phases
from .apply import apply_script, install_lines
from .graph import resolve
from .params import Overrides, Setting, check_sets_used, format_sets, resolve_params, where_set
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
Locks = Mapping[str, lockfile.Lock]  # lock name (lockfile.lock_name) -> a resolution standing in for its file
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
        # slim at its default (false) is left out, so the plans and records of other images do not move
        deb = {k: v for k, v in frm["debian"].items() if not (k == "slim" and not v)}
        key = digest(recipe(deb, epoch))
        return Base("debian", key, deb, None, epoch)
    assert parent is not None
    return Base("image", parent.key, None, parent.image, parent.base.epoch if epoch is None else epoch)


def _parent_plan(tree: Tree, image: Image, config_ref: str | None, sets: Overrides | None,
                 stack: tuple[str, ...], out: Collector, memo: Memo | None, locks: Locks) -> BuildPlan | None:
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
    parent = _memo_plan(tree, tree.images[pname], config_ref, sets, (*stack, image.name), memo, locks)
    if tree.images[pname].data["kind"] != image.data["kind"]:
        PARENT_CHECK.report(out, image.file, image.line("kind"), "kind",
                            f"expected kind {tree.images[pname].data['kind']!r} like parent image {pname!r}, "
                            f"found {image.data['kind']!r}", "a node image builds on a node image")
    return parent


def check_asserts(layer: Layer, ctx: dict[str, Any], out: Collector,
                  settings: Mapping[str, dict[str, Setting]] | None = None) -> None:
    """A layer's `asserts`: conditions on parameter values, checked before anything is built. A
    failed one names the values its condition reads and where each was set (settings: layer ->
    parameter -> Setting), e.g. `(values: swappiness = 900 (--set sysctl.swappiness=900))`."""
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
        where = where_set(a["that"], layer.name, dict(settings or {}))
        if where:
            message = f"{message or a['name']} (values: {where})"
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
                     tuple(c["entrypoint"]) if c["entrypoint"] is not None else None, install, cut=c["cut"])
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
            sets: Overrides) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, dict[str, Setting]]]:
    inherited = parent.inherited_layers + tuple(s.layer for s in parent.steps) if parent else ()
    extra = tuple(config.data["layers"][image.data["kind"]]) if config else ()
    order = resolve(tree, image, inherited, out, extra, config).order
    out.raise_if_any()
    settings = resolve_params(tree, order, image, config, sets, out, release_of(tree, image))
    out.raise_if_any()
    return inherited, order, settings


def compose(tree: Tree, image_ref: str, config_ref: str | None = None,
            sets: Overrides | None = None, _stack: tuple[str, ...] = (),
            memo: Memo | None = None, locks: Locks | None = None) -> BuildPlan:
    """The plan of one image with one config. memo: plans already composed with the same tree,
    config and sets (validate composes every image, and every image composes its parents).
    locks: resolutions a build made (under build/) that stand in for the lock files of those
    (image, config) pairs, by lockfile.lock_name."""
    image = tree.image(image_ref)
    plan = _memo_plan(tree, image, config_ref, sets, _stack, memo, locks or {})
    if not _stack and sets:  # the image asked for, not a parent composed for it (sets reach the parents too)
        check_sets_used(sets, image.name, (*plan.inherited_layers, *(s.layer for s in plan.steps)),
                        _descendant_layers(tree, image, config_ref))
    return plan


def _memo_plan(tree: Tree, image: Image, config_ref: str | None, sets: Overrides | None,
               stack: tuple[str, ...], memo: Memo | None, locks: Locks) -> BuildPlan:
    key = (image.name, config_ref, repr(sets or []) + repr(sorted(locks)))
    plan = memo.get(key) if memo is not None else None
    if plan is None:
        try:
            plan = _owned(tree, image, config_ref, sets, stack, memo, locks)
        except DefinitionError as e:
            _name_image(e, image, tree)
            raise
        if memo is not None:
            memo[key] = plan
    return plan


COMPOSING = "while composing image"


def _name_image(e: DefinitionError, image: Image, tree: Tree) -> None:
    """Each problem of a layer (or lock) names the image whose composition found it (`validate`
    composes every image with every config): the innermost one, so a parent's problem names the
    parent, once. A problem in an image's or a config's own file is told there, not at an image."""
    told = {i.file for i in tree.images.values()} | {c.file for c in tree.configs.values()}
    note = f" ({COMPOSING} {image.name}, {image.file})"
    e.problems[:] = [p if p.file in told or COMPOSING in p.message
                     else dataclasses.replace(p, message=p.message + note) for p in e.problems]


def _owned(tree: Tree, image: Image, config_ref: str | None, sets: Overrides | None,
           stack: tuple[str, ...], memo: Memo | None, locks: Locks) -> BuildPlan:
    """The rule of the tags and locks: a tag and a lock belong to one (image, config) pair. A config
    that leaves the image's key as it is without a config builds it under its plain tags and lock
    (images/NAME.lock); one that moves the key (its params, its layers, a parent it changes) under
    tags qualified by the config (nodeforge/NAME:VERSION-CONFIG) and images/NAME@CONFIG.lock."""
    plain_lock = _lock(tree, image.name, None, locks)
    if config_ref is None:
        return _compose(tree, image, None, sets, stack, memo, plain_lock, locks)
    config = tree.config(config_ref)
    assert config is not None
    try:
        plain: BuildPlan | None = _memo_plan(tree, image, None, sets, stack, memo, locks)
    except DefinitionError:  # the image needs the config (a parameter only it sets): the config's own
        plain = None
    if plain is not None:
        tentative = _compose(tree, image, config_ref, sets, stack, memo, plain_lock, locks)
        if tentative.key == plain.key:
            return tentative
    qualified = _compose(tree, image, config_ref, sets, stack, memo, _lock(tree, image.name, config.name, locks),
                         locks)
    return dataclasses.replace(qualified, tags=tags_of(image, config.name))


def _lock(tree: Tree, image: str, config: str | None, locks: Locks) -> lockfile.Lock | None:
    name = lockfile.lock_name(image, config)
    return locks[name] if name in locks else lockfile.read(tree.root, image, config)


def tags_of(image: Image, config: str | None = None) -> tuple[str, ...]:
    """An image's engine tags: outputs.tags (or nodeforge/NAME:VERSION), each tag qualified by the
    config when the config changes the image (see _owned)."""
    tags = _plain_tags(image.name, image.data["version"], image.data["outputs"]["tags"])
    return tags if config is None else tuple(qualify_tag(t, config) for t in tags)


def _plain_tags(name: str, version: str, tags: list[str]) -> tuple[str, ...]:
    return tuple(tags) or (f"nodeforge/{name}:{version}",)


def qualify_tag(tag: str, config: str) -> str:
    """repo:tag -> repo:tag-CONFIG (repo -> repo:latest-CONFIG); a config name's '+' (not allowed in an
    engine tag) becomes '_'."""
    repo, sep, tg = tag.rpartition(":")
    if not sep or "/" in tg:
        repo, tg = tag, "latest"
    return f"{repo}:{tg}-{config.replace('+', '_')}"


def lock_config(plan: BuildPlan) -> str | None:
    """The config that owns the plan's tags, lock and outputs: its config when the config changes the
    image (the tags are qualified), else None (the plain tags and images/NAME.lock)."""
    if plan.config is None:
        return None
    plain = _plain_tags(plan.image, plan.version, list(plan.outputs.get("tags") or []))
    return plan.config if plan.tags != plain else None


def output_name(plan: BuildPlan) -> str:
    """What the plan's outputs under build/ are named by (build/images/<this>/): NAME, or NAME@CONFIG
    for a config that changes the image, like its lock file."""
    return lockfile.lock_name(plan.image, lock_config(plan))


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


def release_of(tree: Tree, image: Image) -> str:
    """The Debian release an image is built on (its own base's suite, or the first parent's that
    bootstraps): `image.release` in templates, for the values layers set per release."""
    seen = {image.name}
    while "image" in image.data["from"]:
        parent = tree.images.get(image.data["from"]["image"])
        if parent is None or parent.name in seen:
            return ""
        seen.add(parent.name)
        image = parent
    return str((image.data["from"].get("debian") or {}).get("suite", ""))


def _compose(tree: Tree, image: Image, config_ref: str | None, sets: Overrides | None,
             _stack: tuple[str, ...], memo: Memo | None, locked: lockfile.Lock | None, locks: Locks) -> BuildPlan:
    config, out = tree.config(config_ref), Collector()
    parent = _parent_plan(tree, image, config_ref, sets, _stack, out, memo, locks)
    cut.check_parent(image, parent, out)
    base = _base(image, out, parent)
    inherited, order, settings = _layers(tree, image, config, parent, out, sets or [])
    merged = Merged(out)
    if parent:
        contributions.inherit(merged, parent)
    all_params = {n: {p: s.value for p, s in ps.items()} for n, ps in settings.items()}
    ictx = {"params": all_params, "site": _site(config),
            "image": {"name": image.name, "kind": image.data["kind"], "version": image.data["version"],
                      "release": release_of(tree, image)}}
    unkeyed: list[tuple[LayerStep, dict[str, Any]]] = []
    tests: list[Test] = []
    for name in order:
        ctx = {**all_params[name], **ictx}
        check_asserts(tree.layers[name], ctx, out, settings)
        seen_as, sources = host_sources.of_layer(tree.layers[name], settings[name], out)
        scope = LayerScope(tree.layers[name], {**ctx, **seen_as}, settings[name], merged, locked)
        step, package_inputs, layer_tests = layer_step(scope)
        if step is not None:
            unkeyed.append((dataclasses.replace(step, host_sources=sources), package_inputs))
            tests.extend(layer_tests)
    image_tests = _image_level(tree, image, ictx, merged, out)
    unkeyed = cut.with_environment(image, unkeyed, contributions.kind("env").plan_value(merged), out)
    install, steps, boot = phases.assign_keys(base.key, unkeyed, image.data["kind"] == "node")
    if image.data["kind"] == "node":
        tests += derived_boot_tests(merged, tests)
    tests += image_tests
    cutting = any(s.cut is not None for s in steps)
    if cutting:  # its tests are its own: the full image's ran on the image it is cut from
        cut.check_tests(image, tests, out)
    if not out.problems:  # what the build would reject later, said now
        check_prebuild(image, merged, locked, parent, out)
    out.raise_if_any()
    tags = tags_of(image)
    params = {f"{n}.{p}": Value(s.value, s.source) for n, ps in settings.items() for p, s in ps.items()}
    return BuildPlan(
        format=PLAN_FORMAT, image=image.name, kind=image.data["kind"], version=image.data["version"],
        summary=image.data["summary"], config=config.name if config else None, base=base, steps=tuple(steps),
        tags=tags, params={**parent.params, **params} if parent else params,
        tests=(*parent.tests, *tests) if parent and not cutting else tuple(tests),
        outputs=dict(image.data["outputs"]),
        inherited_layers=inherited, user=image.data.get("user"), sets=format_sets(sets or []), install=install,
        boot=boot, **contributions.plan_fields(merged))
