"""Stage 2: resolve the layers of an image, merge parameters and typed contributions, detect
conflicts, render templates and produce a frozen BuildPlan with a content key per step."""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from .. import lockfile as lock
from ..checks import kargs, sysctl
from ..debian import APT_INSTALL, PKG_PATTERN
from ..definitions.load import Image, Layer, Tree
from ..definitions.tables import ALLOWED_SCOPES, DEFAULT_SCOPE, TEST_KINDS
from ..errors import Collector
from ..plan import PLAN_FORMAT, Base, BuildPlan, ContextFile, LayerStep, Test, Value, digest
from .graph import resolve
from .params import Setting, resolve_params
from .render import environment, render_file, render_string, render_tree

WHEEL_TOOL = "unzip"  # installed for the wheels of a layer and removed in the same step


@dataclass
class Merged:
    """Image-wide contributions with provenance; conflicts are reported as they are added."""

    out: Collector
    sysctl: dict[str, Value] = field(default_factory=dict)
    kargs: dict[str, Value] = field(default_factory=dict)  # name -> full argument
    karg_order: list[str] = field(default_factory=list)
    modules: dict[str, Value] = field(default_factory=dict)
    modprobe: dict[str, Value] = field(default_factory=dict)
    blacklist: dict[str, Value] = field(default_factory=dict)
    enabled: dict[str, Value] = field(default_factory=dict)
    disabled: dict[str, Value] = field(default_factory=dict)
    env: dict[str, Value] = field(default_factory=dict)
    labels: dict[str, Value] = field(default_factory=dict)
    files: dict[str, Value] = field(default_factory=dict)
    packages: dict[str, Value] = field(default_factory=dict)

    def _conflict(self, what: str, key: str, old: Value, new: Value, file: str, line: int | None,
                  lint: str) -> None:
        self.out.add(file, line, f"{what}.{key}",
                     f"conflict: {old.source} sets {key} = {old.value!r}, {new.source} sets {key} = {new.value!r}",
                     "set it in one layer only, or make it a parameter and set it in the config", lint)

    def scalar(self, table: dict[str, Value], what: str, key: str, new: Value, file: str,
               line: int | None) -> None:
        old = table.get(key)
        if old is not None and old.value != new.value:
            self._conflict(what, key, old, new, file, line, f"conflict/{what}")
            return
        if old is None:
            table[key] = new

    def karg(self, arg: str, source: str, file: str, line: int | None) -> None:
        name, value = kargs.split(arg)
        if kargs.is_repeated(name):
            name = arg  # every distinct value is an argument of its own
        old = self.kargs.get(name)
        if old is None:
            self.kargs[name] = Value(arg, source)
            self.karg_order.append(name)
            return
        if old.value == arg:
            return
        if kargs.is_multi(name) and value is not None:
            _, old_value = kargs.split(old.value)
            parts = (old_value or "").split(",")
            parts += [p for p in value.split(",") if p not in parts]
            self.kargs[name] = Value(f"{name}={','.join(parts)}", f"{old.source} + {source}")
            return
        self._conflict("kernel.args", name, old, Value(arg, source), file, line, "conflict/kernel-arg")


def _source(layer: Layer, *keys: Any) -> str:
    return f"layer {layer.name} ({layer.file}:{layer.line(*keys) or '?'})"


def _base(tree: Tree, image: Image, out: Collector, parent: BuildPlan | None) -> Base:
    epoch = image.data.get("source-date-epoch")
    frm = image.data["from"]
    if "debian" in frm:
        if epoch is None:
            out.add(image.file, image.line(), "source-date-epoch",
                    "an image bootstrapped from Debian needs a fixed source-date-epoch",
                    "add e.g. source-date-epoch: 1700000000 (seconds since 1970; bases are then bit-identical)",
                    "image/source-date-epoch")
            epoch = 0
        deb = dict(frm["debian"])
        if parent is None and "non-free" not in deb["components"] and any(
                c == "non-free-firmware" for c in deb["components"]):
            pass
        key = digest({"bootstrap": "mmdebstrap", "debian": deb, "epoch": epoch})
        return Base("debian", key, deb, None, epoch)
    assert parent is not None
    return Base("image", parent.key, None, parent.image, parent.base.epoch if epoch is None else epoch)


def compose(tree: Tree, image_ref: str, config_ref: str | None = None,
            sets: list[tuple[str, str, Any]] | None = None, _stack: tuple[str, ...] = ()) -> BuildPlan:
    image = tree.image(image_ref)
    config = tree.config(config_ref)
    out = Collector()
    parent: BuildPlan | None = None
    if "image" in image.data["from"]:
        pname = image.data["from"]["image"]
        if pname == image.name or pname in _stack:
            out.add(image.file, image.line("from", "image"), "from.image",
                    "image dependency cycle: " + " -> ".join([*_stack, image.name, pname]),
                    "an image cannot be built from itself")
            out.raise_if_any()
        if pname not in tree.images:
            out.add(image.file, image.line("from", "image"), "from.image", f"no image named {pname!r}",
                    "images: " + ", ".join(sorted(tree.images)))
            out.raise_if_any()
        parent = compose(tree, pname, config_ref, sets, (*_stack, image.name))
        if tree.images[pname].data["kind"] != image.data["kind"]:
            out.add(image.file, image.line("kind"), "kind",
                    f"expected kind {tree.images[pname].data['kind']!r} like parent image {pname!r}, "
                    f"found {image.data['kind']!r}", "a node image builds on a node image")
    base = _base(tree, image, out, parent)
    inherited = parent.inherited_layers + tuple(s.layer for s in parent.steps) if parent else ()
    extra = tuple(config.data["layers"][image.data["kind"]]) if config else ()
    resolved = resolve(tree, image, inherited, out, extra)
    out.raise_if_any()
    settings = resolve_params(tree, resolved.order, image, config, sets or [], out)
    out.raise_if_any()

    merged = Merged(out)
    if parent:
        _inherit(merged, parent)
    site = config.data["site"] if config else None
    site = site or {"gpu": {"model": "none", "count": 0, "memory-mib": 0}, "fabric": "none",
                    "power-limit-watts": 0, "registry": None}
    all_params = {n: {p: s.value for p, s in ps.items()} for n, ps in settings.items()}
    image_ctx = {"name": image.name, "kind": image.data["kind"], "version": image.data["version"]}
    locked = lock.read(tree.root, image.name)

    steps: list[LayerStep] = []
    tests: list[Test] = list(parent.tests) if parent else []
    parent_key = base.key
    for index, name in enumerate(resolved.order, start=1):
        layer = tree.layers[name]
        ctx = {**all_params[name], "params": all_params, "site": site, "image": image_ctx}
        _check_asserts(layer, ctx, out)
        step, layer_tests = _layer_step(layer, index + len(inherited), ctx, settings[name], merged, parent_key,
                                        locked, out)
        if step is None:
            continue
        steps.append(step)
        tests.extend(layer_tests)
        parent_key = step.key

    # image-level env, labels and tests
    env_ = environment(tree.root / "images")
    ictx = {"params": all_params, "site": site, "image": image_ctx}
    for k, v in render_tree(env_, image.data["env"], ictx, out, image.file, image.line("env"), "env").items():
        merged.scalar(merged.env, "env", k, Value(str(v), f"image {image.name} ({image.file})"), image.file,
                      image.line("env", k))
    for k, v in render_tree(env_, image.data["labels"], ictx, out, image.file, image.line("labels"),
                            "labels").items():
        merged.labels[k] = Value(str(v), f"image {image.name}")
    for i, t in enumerate(render_tree(env_, image.data["tests"], ictx, out, image.file, image.line("tests"),
                                      "tests")):
        test = _test(t, f"image:{image.name}", image.file, image.line("tests", i), f"tests[{i}]", out)
        if test:
            tests.append(test)
    out.raise_if_any()

    tags = tuple(image.data["outputs"]["tags"]) or (f"nodeforge/{image.name}:{image.data['version']}",)
    params = {f"{n}.{p}": Value(s.value, s.source) for n, ps in settings.items() for p, s in ps.items()}
    if parent:
        params = {**parent.params, **params}
    return BuildPlan(
        format=PLAN_FORMAT, image=image.name, kind=image.data["kind"], version=image.data["version"],
        summary=image.data["summary"], config=config.name if config else None, base=base,
        steps=tuple(steps), tags=tags, labels={k: v.value for k, v in merged.labels.items()},
        env=dict(merged.env), params=params, sysctl=dict(merged.sysctl),
        kernel_args=tuple(merged.kargs[n] for n in merged.karg_order), modules=tuple(merged.modules.values()),
        modprobe=dict(merged.modprobe), blacklist=tuple(merged.blacklist.values()),
        services_enabled=tuple(merged.enabled.values()), services_disabled=tuple(merged.disabled.values()),
        packages=dict(merged.packages), files=dict(merged.files), tests=tuple(tests),
        outputs=dict(image.data["outputs"]), inherited_layers=inherited, user=image.data.get("user"),
    )


FALSE_WORDS = ("", "false", "0", "no", "none")


def _check_asserts(layer: Layer, ctx: dict[str, Any], out: Collector) -> None:
    """A layer's `asserts`: conditions on parameter values, checked before anything is built."""
    env = environment(layer.dir / "files")
    for i, a in enumerate(layer.data["asserts"]):
        line = layer.line("asserts", i)
        that = render_string(env, a["that"], ctx, out, layer.file, line, f"asserts[{i}].that")
        if that is None or that.strip().lower() not in FALSE_WORDS:
            continue
        message = render_string(env, a["message"], ctx, out, layer.file, line, f"asserts[{i}].message")
        remedy = render_string(env, a["remedy"], ctx, out, layer.file, line, f"asserts[{i}].remedy")
        out.add(layer.file, line, f"asserts.{a['name']}", message or a["name"], remedy or "", f"assert/{a['name']}")


def _inherit(merged: Merged, parent: BuildPlan) -> None:
    def tag(v: Value) -> Value:
        return Value(v.value, v.source if v.source.startswith("image ") else f"image {parent.image}: {v.source}")

    for table, src in ((merged.sysctl, parent.sysctl), (merged.modprobe, parent.modprobe),
                       (merged.env, parent.env), (merged.files, parent.files), (merged.packages, parent.packages)):
        table.update({k: tag(v) for k, v in src.items()})
    merged.labels.update({k: Value(v, f"image {parent.image}") for k, v in parent.labels.items()})
    for v in parent.kernel_args:
        name, _ = kargs.split(v.value)
        merged.kargs[name] = tag(v)
        merged.karg_order.append(name)
    for table2, vals in ((merged.modules, parent.modules), (merged.blacklist, parent.blacklist),
                         (merged.enabled, parent.services_enabled), (merged.disabled, parent.services_disabled)):
        table2.update({v.value: tag(v) for v in vals})


def _test(t: dict[str, Any], owner: str, file: str, line: int | None, path: str, out: Collector) -> Test | None:
    kind = next((k for k in TEST_KINDS if t.get(k) is not None), None)
    when = t.get("when")
    if kind is None or (when is not None and str(when).strip().lower() in ("", "false", "0", "no", "none")):
        return None
    scope = t.get("scope") or DEFAULT_SCOPE[kind]
    if scope not in ALLOWED_SCOPES[kind]:
        out.add(file, line, f"{path}.scope",
                f"a {kind} check cannot run at scope {scope!r}",
                f"use scope {' or '.join(sorted(ALLOWED_SCOPES[kind]))}")
        return None
    return Test(t["name"], owner, scope, kind, t[kind], tuple(t.get("requires") or ()), file, line)


def _mode(m: str) -> str:
    return m if len(m) == 4 else "0" + m


def _via(env: Any, raw: Any, layer: str, settings: dict[str, Setting]) -> str:
    """Which parameters a template used, and where their values came from: provenance through templates."""
    if not isinstance(raw, str) or "{{" not in raw:
        return ""
    try:
        names = jinja2.meta.find_undeclared_variables(env.parse(raw))
    except jinja2.TemplateSyntaxError:
        return ""
    return "".join(f" via {layer}.{n} <- {settings[n].source}" for n in sorted(names) if n in settings)


def _layer_step(layer: Layer, index: int, ctx: dict[str, Any], settings: dict[str, Setting], merged: Merged,
                parent_key: str, locked: lock.Lock | None, out: Collector) -> tuple[LayerStep | None, list[Test]]:
    d = layer.data
    env = environment(layer.dir / "files")
    file, name = layer.file, layer.name
    before = len(out.problems)

    def r(value: Any, *keys: Any) -> Any:
        return render_tree(env, value, ctx, out, file, layer.line(*keys), ".".join(map(str, keys)))

    files: list[ContextFile] = []

    def add_file(path: str, content: str | bytes, mode: str, owner: str, group: str, origin: str,
                 line: int | None, static: Path | None = None) -> None:
        data = content.encode() if isinstance(content, str) else content
        sha = hashlib.sha256(data).hexdigest()
        merged.scalar(merged.files, "files", path, Value(sha, origin), file, line)
        files.append(ContextFile(path, _mode(mode), owner, group, sha, origin,
                                 content if isinstance(content, str) else None,
                                 str(static) if static else None))

    # files
    for i, f in enumerate(d["files"]):
        line = layer.line("files", i)
        origin = _source(layer, "files", i)
        path = render_string(env, f["path"], ctx, out, file, line, f"files[{i}].path")
        if path is None:
            continue
        if f.get("content") is not None:
            text = (render_string(env, f["content"], ctx, out, file, line, f"files[{i}].content")
                    if f.get("template", True) is not False else f["content"])
            if text is not None:
                add_file(path, text, f["mode"], f["owner"], f["group"], origin, line)
        else:
            src = f["source"]
            template = f.get("template")
            if template is None:
                template = src.endswith(".j2")
            if template:
                text = render_file(env, src, ctx, out, file, line, f"files[{i}].source")
                if text is not None:
                    add_file(path, text, f["mode"], f["owner"], f["group"], origin, line)
            else:
                static = layer.dir / "files" / src
                add_file(path, static.read_bytes(), f["mode"], f["owner"], f["group"], origin, line, static)

    # repositories: the sources file and the key travel as files
    repos = d["packages"]["repos"]
    for i, repo in enumerate(repos):
        line = layer.line("packages", "repos", i)
        keyring = f"/usr/share/keyrings/{repo['name']}.gpg"
        key_bytes = (layer.dir / "files" / repo["key"]).read_bytes()
        add_file(keyring, key_bytes, "0644", "root", "root", _source(layer, "packages", "repos", i), line,
                 layer.dir / "files" / repo["key"])
        sources = (f"# from layer {name}\nTypes: deb\nURIs: {repo['uri']}\nSuites: {' '.join(repo['suites'])}\n"
                   + (f"Components: {' '.join(repo['components'])}\n" if repo["components"] else "")
                   + f"Signed-By: {keyring}\n")
        add_file(f"/etc/apt/sources.list.d/{repo['name']}.sources", sources, "0644", "root", "root",
                 _source(layer, "packages", "repos", i), line)

    # sysctl
    sysctl_lines = []
    for key, raw_value in d["sysctl"].items():
        line = layer.line("sysctl", key)
        value = raw_value
        if isinstance(raw_value, str):
            value = render_string(env, raw_value, ctx, out, file, line, f"sysctl.{key}")
            if value is None:
                continue
        text = sysctl.normalise(value)
        problem = sysctl.check_key(key) or sysctl.check_value(text)
        if problem:
            out.add(file, line, f"sysctl.{key}", problem[0], problem[1], "sysctl/shape")
            continue
        merged.scalar(merged.sysctl, "sysctl", key,
                      Value(text, _source(layer, "sysctl", key) + _via(env, raw_value, name, settings)), file, line)
        sysctl_lines.append(f"{key} = {text}")
    if sysctl_lines:
        add_file(f"/etc/sysctl.d/90-nodeforge-{name}.conf",
                 f"# nodeforge layer {name}: {d['summary']}\n" + "\n".join(sysctl_lines) + "\n",
                 "0644", "root", "root", f"layer {name} sysctl", layer.line("sysctl"))

    # kernel
    k = d["kernel"]
    good_args = []
    for i, raw_arg in enumerate(k["args"]):
        line = layer.line("kernel", "args", i)
        for arg in render_tree(env, [raw_arg], ctx, out, file, line, f"kernel.args[{i}]"):
            problem = kargs.check(arg)
            if problem:
                out.add(file, line, f"kernel.args[{i}]", f"{arg!r}: {problem[0]}", problem[1], "kernel-arg/known")
                continue
            merged.karg(arg, _source(layer, "kernel", "args", i) + _via(env, raw_arg, name, settings), file, line)
            good_args.append(arg)
    if good_args:
        add_file(f"/etc/nodeforge/kernel-cmdline.d/{name}.conf",
                 f"# nodeforge layer {name}: kernel arguments\n" + "\n".join(good_args) + "\n",
                 "0644", "root", "root", f"layer {name} kernel.args", layer.line("kernel", "args"))
    modules = r(k["modules"], "kernel", "modules")
    blacklist = r(k["blacklist"], "kernel", "blacklist")
    for i, m in enumerate(modules):
        merged.scalar(merged.modules, "kernel.modules", m, Value(m, _source(layer, "kernel", "modules", i)),
                      file, layer.line("kernel", "modules", i))
        if m in merged.blacklist:
            out.add(file, layer.line("kernel", "modules", i), f"kernel.modules[{i}]",
                    f"conflict: {_source(layer, 'kernel', 'modules', i)} loads {m}, "
                    f"{merged.blacklist[m].source} blacklists it", "load it or blacklist it, not both",
                    "conflict/module")
    for i, m in enumerate(blacklist):
        if m in merged.modules:
            out.add(file, layer.line("kernel", "blacklist", i), f"kernel.blacklist[{i}]",
                    f"conflict: {_source(layer, 'kernel', 'blacklist', i)} blacklists {m}, "
                    f"{merged.modules[m].source} loads it", "load it or blacklist it, not both", "conflict/module")
        merged.blacklist.setdefault(m, Value(m, _source(layer, "kernel", "blacklist", i)))
    modprobe_lines = [f"blacklist {m}" for m in blacklist]
    for module, options in k["modprobe"].items():
        opts = []
        for opt, raw in options.items():
            line = layer.line("kernel", "modprobe", module, opt)
            value = raw
            if isinstance(raw, str):
                value = render_string(env, raw, ctx, out, file, line, f"kernel.modprobe.{module}.{opt}")
                if value is None:
                    continue
            text = sysctl.normalise(value)
            merged.scalar(merged.modprobe, "kernel.modprobe", f"{module}.{opt}",
                          Value(text, _source(layer, "kernel", "modprobe", module, opt)
                                + _via(env, raw, name, settings)), file, line)
            opts.append(f"{opt}={text}")
        if opts:
            modprobe_lines.append(f"options {module} {' '.join(opts)}")
    if modprobe_lines:
        add_file(f"/etc/modprobe.d/nodeforge-{name}.conf",
                 f"# nodeforge layer {name}: module options and blacklist\n" + "\n".join(modprobe_lines) + "\n",
                 "0644", "root", "root", f"layer {name} kernel.modprobe", layer.line("kernel"))
    if modules:
        add_file(f"/etc/modules-load.d/nodeforge-{name}.conf",
                 f"# nodeforge layer {name}: modules loaded at boot\n" + "\n".join(modules) + "\n",
                 "0644", "root", "root", f"layer {name} kernel.modules", layer.line("kernel", "modules"))

    # services, env, labels
    for i, unit in enumerate(d["services"]["enable"]):
        merged.enabled[unit] = Value(unit, _source(layer, "services", "enable", i))
        if unit in merged.disabled:
            out.add(file, layer.line("services", "enable", i), f"services.enable[{i}]",
                    f"conflict: {merged.enabled[unit].source} enables {unit}, {merged.disabled[unit].source} "
                    "disables it", "enable or disable it, not both", "conflict/service")
    for i, unit in enumerate(d["services"]["disable"]):
        merged.disabled[unit] = Value(unit, _source(layer, "services", "disable", i))
        if unit in merged.enabled:
            out.add(file, layer.line("services", "disable", i), f"services.disable[{i}]",
                    f"conflict: {merged.enabled[unit].source} enables {unit}, {merged.disabled[unit].source} "
                    "disables it", "enable or disable it, not both", "conflict/service")
    env_items = []
    for key, raw in d["env"].items():
        line = layer.line("env", key)
        value = render_string(env, str(raw), ctx, out, file, line, f"env.{key}")
        if value is None:
            continue
        merged.scalar(merged.env, "env", key, Value(value, _source(layer, "env", key)), file, line)
        env_items.append((key, value))
    for key, raw in d["labels"].items():
        line = layer.line("labels", key)
        value = render_string(env, str(raw), ctx, out, file, line, f"labels.{key}")
        if value is not None:
            merged.scalar(merged.labels, "labels", key, Value(value, _source(layer, "labels", key)), file, line)

    # packages
    packages = r(d["packages"]["apt"], "packages", "apt")
    for i, p in enumerate(packages):
        if not re.fullmatch(PKG_PATTERN, p):
            out.add(file, layer.line("packages", "apt", i), f"packages.apt[{i}]",
                    f"expected a Debian package name, found {p!r}",
                    "give the name only; versions come from the lock file")
    packages = [p for p in packages if p not in merged.packages]
    # wheels: fetched and checked against the lock's sha256, unpacked with unzip (a build-only tool)
    wheel_reqs = [w for w in r(d["packages"]["pip"], "packages", "pip") if w]
    wheel_target = render_string(env, d["packages"]["pip-target"], ctx, out, file,
                                 layer.line("packages", "pip-target"), "packages.pip-target") or ""
    build_only = [WHEEL_TOOL] if wheel_reqs and WHEEL_TOOL not in packages else []
    pinned, is_locked = lock.pins(locked, name, packages + build_only)
    for i, p in enumerate(packages):
        merged.packages[p] = Value(pinned[i].partition("=")[2] or "*", _source(layer, "packages", "apt"))
    locked_wheels = lock.wheels(locked, name)
    if wheel_reqs:
        is_locked = is_locked and lock.wheels_locked(locked, name, wheel_reqs)
        for w, info in locked_wheels.items():
            merged.packages[f"pip:{w}"] = Value(info["version"], _source(layer, "packages", "pip"))
    entrypoint = r(d["entrypoint"], "entrypoint") if d.get("entrypoint") is not None else None

    if len(out.problems) > before:
        return None, []

    holds = r(d["packages"]["hold"], "packages", "hold")
    for i, p in enumerate(holds):
        if not re.fullmatch(PKG_PATTERN, p):
            out.add(file, layer.line("packages", "hold", i), f"packages.hold[{i}]",
                    f"expected a Debian package name, found {p!r}", "give the name of a package the layer installs")
    apply = _apply_script(layer, pinned, holds, d["users"], files, d["services"],
                          d["steps"], env, ctx, out, wheels=locked_wheels if wheel_reqs else None,
                          wheel_target=wheel_target, build_only=pinned[len(packages):])
    tests = []
    for i, t in enumerate(d["tests"]):
        rendered = r(t, "tests", i)
        test = _test(rendered, name, file, layer.line("tests", i), f"tests[{i}]", out)
        if test:
            tests.append(test)
    key_inputs = {
        "parent": parent_key, "layer": name, "apply": apply, "env": env_items,
        "files": [(f.path, f.mode, f.owner, f.group, f.sha256) for f in files],
        "locked": lock.entry(locked, name),
    }
    if wheel_reqs:  # only where used: the keys of layers without these stay as they were
        key_inputs["wheels"] = {"requirements": wheel_reqs, "target": wheel_target, "locked": locked_wheels}
    if entrypoint is not None:
        key_inputs["entrypoint"] = entrypoint
    step = LayerStep(name, d["summary"], digest(key_inputs), tuple(files), apply, tuple(env_items),
                     tuple(pinned), is_locked, tuple(wheel_reqs),
                     tuple(entrypoint) if entrypoint is not None else None)
    return step, tests


def _wheel_lines(wheels: dict[str, dict[str, str]], target: str, build_only: list[str]) -> list[str]:
    """Download each locked wheel, check its sha256, unpack it into the target; no pip in the image."""
    if not wheels:
        return ["# wheels: not locked yet (`nodeforge lock` resolves them)"]
    tmp = "/tmp/nodeforge-wheels"
    lines = ["# wheels (exact versions and sha256 from the lock file; unpacked, no pip in the image)",
             f"install -d -m 0777 {tmp}", f"install -d -m 0755 {shlex.quote(target)}",
             "# extra CAs of the build host's network, from a build argument; never left in the image",
             "ca=()",
             'if [ -n "${NODEFORGE_CA_BUNDLE:-}" ]; then',
             f'  printf "%s\\n" "$NODEFORGE_CA_BUNDLE" >{tmp}/ca.pem; ca=(-o Acquire::https::CaInfo={tmp}/ca.pem)',
             "fi"]
    for name, w in sorted(wheels.items()):
        file = f"{tmp}/{w['url'].rsplit('/', 1)[-1].split('#')[0]}"
        lines += [f"# {name} {w['version']}",
                  f"/usr/lib/apt/apt-helper -q \"${{ca[@]}}\" download-file {shlex.quote(w['url'])} "
                  f"{shlex.quote(file)} SHA256:{w['sha256']}",
                  f"echo {shlex.quote(w['sha256'] + '  ' + file)} | sha256sum --check --quiet",
                  f"unzip -q -o {shlex.quote(file)} -d {shlex.quote(target)}", f"rm -f {shlex.quote(file)}"]
    lines.append(f"rm -rf {tmp}")
    if build_only:
        names = " ".join(p.partition("=")[0] for p in build_only)
        lines.append(f"apt-get purge -y -q --auto-remove {names}  # build-only: unpacks the wheels")
    return lines


def _apply_script(layer: Layer, packages: list[str], holds: list[str], users: list[dict[str, Any]],
                  files: list[ContextFile], services: dict[str, list[str]], steps: list[dict[str, Any]],
                  env: Any, ctx: dict[str, Any], out: Collector, wheels: dict[str, dict[str, str]] | None = None,
                  wheel_target: str = "", build_only: list[str] | None = None) -> str:
    lines: list[str] = []
    if packages:
        lines += ["# packages (versions from the lock file)", "apt-get update -q",
                  f"{APT_INSTALL} \\\n    " + " \\\n    ".join(shlex.quote(p) for p in packages)]
    if wheels is not None and (wheels or layer.data["packages"]["pip"]):
        lines += _wheel_lines(wheels, wheel_target, build_only or [])
    if holds:
        lines += ["apt-mark hold " + " ".join(holds)]
    if packages:
        lines += ["apt-get clean", "rm -rf /var/lib/apt/lists/*"]
    for u in users:
        opts = ["--create-home", "--shell", u["shell"]]
        if u.get("uid") is not None:
            opts += ["--uid", str(u["uid"])]
        if u.get("system"):
            opts.append("--system")
        if u.get("groups"):
            opts += ["--groups", ",".join(u["groups"])]
        lines.append(f"id -u {u['name']} >/dev/null 2>&1 || useradd {' '.join(opts)} {u['name']}")
    for f in files:
        if (f.owner, f.group) != ("root", "root"):
            lines.append(f"chown {shlex.quote(f.owner)}:{shlex.quote(f.group)} {shlex.quote(f.path)}")
    if services["enable"] or services["disable"]:
        lines.append("command -v systemctl >/dev/null || { echo 'services need systemd in the image' >&2; exit 1; }")
    for unit in services["enable"]:
        lines.append(f"systemctl enable {shlex.quote(unit)}")
    for unit in services["disable"]:
        lines.append(f"systemctl disable {shlex.quote(unit)} || true")
    for i, s in enumerate(steps):
        run = render_string(env, s["run"], ctx, out, layer.file, layer.line("steps", i), f"steps[{i}].run")
        if run is None:
            continue
        lines += [f"# step: {s['name']}", "(", run.rstrip("\n"), ")"]
    if not lines:
        return ""
    head = [f"# nodeforge layer {layer.name}: {layer.data['summary']}", "set -euo pipefail",
            "export DEBIAN_FRONTEND=noninteractive"]
    return "\n".join([*head, *lines]) + "\n"
