"""One handler per contribution kind: read the layer's key, render it, check it, merge it into the
image-wide table (conflicts reported there) and add the files it writes to the build context.
The table that names them, with their plan field, inheritance, explanation and diff, is
compose.contributions."""

from __future__ import annotations

import re
from typing import Any

from .. import lockfile
from ..checks import kargs, sysctl
from ..checks.registry import check
from ..debian import PKG_PATTERN
from ..definitions import grammar as g
from ..definitions.guard import guarded
from ..plan import BOOT_FILES, Value
from .render import destination, file_destination, template_head
from .scope import LayerScope
from .tests import RENDERED_VALUE, is_false, one_line

WHEEL_TOOL = "unzip"  # installed for the wheels of a layer and removed in the same step

KARG_KNOWN = check("kernel-arg/known", "compose",
                   "a kernel argument must be a known parameter in its corrected form (pci=pcie_bus_perf, "
                   "not pcie_bus_perf; no pcie_replay_count, rd.blacklist, amd_iommu=on, pcie_acs_override)",
                   "use the form the message names")
SYSCTL_SHAPE = check("sysctl/shape", "compose", "a sysctl key must sit in a /proc/sys namespace, its value on one line",
                     "write the key as /proc/sys shows it with dots, e.g. vm.swappiness")
MODULE_BOTH = check("conflict/module", "compose", "a kernel module is both loaded and blacklisted",
                    "load it or blacklist it, not both")
SERVICE_BOTH = check("conflict/service", "compose", "a unit is both enabled and disabled",
                     "enable or disable it, not both")
PACKAGE_NAME = check("package/name", "compose", "packages.apt and packages.hold hold Debian package names only",
                     "give the name only; versions come from the lock file")


SERVICE_UNIT = check("service/unit", "compose", "a rendered services.enable or services.disable item is a systemd "
                     "unit name with its suffix", "render a name such as chrony.service, or empty to drop the item")


def kept(s: LayerScope, items: list[Any], *keys: Any) -> list[Any]:
    """The list items whose `when:` (the {item, when} form) renders true, unwrapped; plain items as they are."""
    out = []
    for i, item in enumerate(items):
        if guarded(item):
            path = ".".join(map(str, keys)) + f"[{i}].when"
            cond = s.text(item["when"], path, *keys, i)
            if cond is None or is_false(cond):
                continue
            item = item["item"]
        out.append(item)
    return out


def value_text(value: object) -> str:
    """A sysctl or module option value as the kernel prints it: booleans as 1/0, one line."""
    return sysctl.normalise(value)


def read_files(s: LayerScope) -> None:
    for i, f in enumerate(s.data["files"]):
        line, origin = s.line("files", i), s.source("files", i)
        if f.get("when") is not None:
            cond = s.text(f["when"], f"files[{i}].when", "files", i)
            if cond is None or is_false(cond):
                continue
        path = s.text(f["path"], f"files[{i}].path", "files", i)
        if path is None:
            continue
        why = g.PATH.problem(path)  # a rendered path obeys what a literal one does, and is one spelling
        if why:
            RENDERED_VALUE.report(s.out, s.layer.file, line, f"files[{i}].path", why)
            continue
        path = g.PATH.normalise(path)
        owner = {"mode": f["mode"], "owner": f["owner"], "group": f["group"], "phase": f.get("phase")}
        head = f["content"] if f.get("content") is not None else template_head(s.env, f["source"])
        with destination(file_destination(path, head)):
            _read_file(s, f, i, path, origin, line, owner)


def _read_file(s: LayerScope, f: dict[str, Any], i: int, path: str, origin: str, line: int | None,
               owner: dict[str, Any]) -> None:
    """One file: its content rendered (or taken as it is) for the destination the caller chose."""
    if f.get("content") is not None:
        text = s.text(f["content"], f"files[{i}].content", "files", i) if f.get("template", True) is not False \
            else f["content"]
        if text is not None:
            s.add_file(path, text, origin, line, **owner)
        return
    src, template = f["source"], f.get("template")
    if template is None:
        template = src.endswith(".j2")
    if template:
        text = s.file_template(src, f"files[{i}].source", "files", i)
        if text is not None:
            s.add_file(path, text, origin, line, **owner)
    else:
        static = s.layer.dir / "files" / src
        s.add_file(path, static.read_bytes(), origin, line, static=static, **owner)


def read_repos(s: LayerScope) -> None:
    """Extra signed repositories: the sources file and the key travel as files."""
    for i, repo in enumerate(s.data["packages"]["repos"]):
        line, origin = s.line("packages", "repos", i), s.source("packages", "repos", i)
        keyring = f"/usr/share/keyrings/{repo['name']}.gpg"
        key = s.layer.dir / "files" / repo["key"]
        s.add_file(keyring, key.read_bytes(), origin, line, static=key)
        sources = (f"# from layer {s.name}\nTypes: deb\nURIs: {repo['uri']}\nSuites: {' '.join(repo['suites'])}\n"
                   + (f"Components: {' '.join(repo['components'])}\n" if repo["components"] else "")
                   + f"Signed-By: {keyring}\n")
        s.add_file(f"/etc/apt/sources.list.d/{repo['name']}.sources", sources, origin, line)


def read_sysctl(s: LayerScope) -> None:
    lines = []
    for key, raw in s.data["sysctl"].items():
        line = s.line("sysctl", key)
        value = s.text(raw, f"sysctl.{key}", "sysctl", key) if isinstance(raw, str) else raw
        if value is None:
            continue
        text = value_text(value)
        problem = sysctl.check_key(key) or sysctl.check_value(text)
        if problem:
            SYSCTL_SHAPE.report(s.out, s.layer.file, line, f"sysctl.{key}", problem[0], problem[1])
            continue
        s.merged.scalar("sysctl", key, Value(text, s.source("sysctl", key) + s.via(raw)), s.layer.file, line,
                        owner=s.name)
        lines.append(f"{key} = {text}")
    if lines:
        s.add_file(f"/etc/sysctl.d/90-nodeforge-{s.name}.conf",
                   f"# nodeforge layer {s.name}: {s.data['summary']}\n" + "\n".join(lines) + "\n",
                   f"layer {s.name} sysctl", s.line("sysctl"), phase=BOOT_FILES)


def read_kernel_args(s: LayerScope) -> None:
    good = []
    for i, raw in enumerate(s.data["kernel"]["args"]):
        line = s.line("kernel", "args", i)
        if guarded(raw):
            if not kept(s, [raw], "kernel", "args"):
                continue
            raw = raw["item"]
        for arg in s.render([raw], "kernel", "args", i):
            problem = kargs.check(arg)
            if problem:
                KARG_KNOWN.report(s.out, s.layer.file, line, f"kernel.args[{i}]", f"{arg!r}: {problem[0]}",
                                  problem[1])
                continue
            s.merged.karg(arg, s.source("kernel", "args", i) + s.via(raw), s.layer.file, line, owner=s.name)
            good.append(arg)
    if good:
        s.add_file(f"/etc/nodeforge/kernel-cmdline.d/{s.name}.conf",
                   f"# nodeforge layer {s.name}: kernel arguments\n" + "\n".join(good) + "\n",
                   f"layer {s.name} kernel.args", s.line("kernel", "args"), phase=BOOT_FILES)


def read_blacklist(s: LayerScope) -> None:
    blacklist = s.render(kept(s, s.data["kernel"]["blacklist"], "kernel", "blacklist"), "kernel", "blacklist")
    _module_names(s, blacklist, "blacklist")
    modules = s.merged.table("kernel.modules")
    for i, m in enumerate(blacklist):
        if m in modules:
            MODULE_BOTH.report(s.out, s.layer.file, s.line("kernel", "blacklist", i), f"kernel.blacklist[{i}]",
                               f"conflict: {s.source('kernel', 'blacklist', i)} blacklists {m}, "
                               f"{modules[m].source} loads it")
        s.merged.table("kernel.blacklist").setdefault(m, Value(m, s.source("kernel", "blacklist", i)))
    s.carry["blacklist"] = blacklist


def read_modprobe(s: LayerScope) -> None:
    """Module options, and this layer's blacklist, in /etc/modprobe.d (the initramfs step copies them)."""
    lines = [f"blacklist {m}" for m in s.carry.get("blacklist", [])]
    for module, options in s.data["kernel"]["modprobe"].items():
        opts = []
        for opt, raw in options.items():
            line = s.line("kernel", "modprobe", module, opt)
            value = s.text(raw, f"kernel.modprobe.{module}.{opt}", "kernel", "modprobe", module, opt) \
                if isinstance(raw, str) else raw
            if value is None:
                continue
            text = value_text(value)
            why = g.MODULE_OPTION_VALUE.problem(text)
            if why:
                RENDERED_VALUE.report(s.out, s.layer.file, line, f"kernel.modprobe.{module}.{opt}", why)
                continue
            s.merged.scalar("kernel.modprobe", f"{module}.{opt}",
                            Value(text, s.source("kernel", "modprobe", module, opt) + s.via(raw)),
                            s.layer.file, line)
            opts.append(f"{opt}={text}")
        if opts:
            lines.append(f"options {module} {' '.join(opts)}")
    if lines:
        s.add_file(f"/etc/modprobe.d/nodeforge-{s.name}.conf",
                   f"# nodeforge layer {s.name}: module options and blacklist\n" + "\n".join(lines) + "\n",
                   f"layer {s.name} kernel.modprobe", s.line("kernel"))


def _module_names(s: LayerScope, names: list[Any], key: str) -> None:
    for i, why in g.rendered_problems(g.MODULE, names):
        RENDERED_VALUE.report(s.out, s.layer.file, s.line("kernel", key, i), f"kernel.{key}[{i}]", why)


def read_modules(s: LayerScope) -> None:
    modules = s.render(kept(s, s.data["kernel"]["modules"], "kernel", "modules"), "kernel", "modules")
    _module_names(s, modules, "modules")
    blacklist = s.merged.table("kernel.blacklist")
    for i, m in enumerate(modules):
        line = s.line("kernel", "modules", i)
        s.merged.scalar("kernel.modules", m, Value(m, s.source("kernel", "modules", i)), s.layer.file, line)
        if m in blacklist:
            MODULE_BOTH.report(s.out, s.layer.file, line, f"kernel.modules[{i}]",
                               f"conflict: {s.source('kernel', 'modules', i)} loads {m}, "
                               f"{blacklist[m].source} blacklists it")
    if modules:
        s.add_file(f"/etc/modules-load.d/nodeforge-{s.name}.conf",
                   f"# nodeforge layer {s.name}: modules loaded at boot\n" + "\n".join(modules) + "\n",
                   f"layer {s.name} kernel.modules", s.line("kernel", "modules"))


def _services(s: LayerScope, mine: str, other: str) -> None:
    """Units rendered (an item that renders empty is dropped, as is one whose when: is false) and checked."""
    units = []
    for i, raw in enumerate(s.data["services"][mine]):
        for unit in s.render(kept(s, [raw], "services", mine), "services", mine, i):
            why = g.UNIT.problem(unit) if isinstance(unit, str) else f"expected a unit name, found {unit!r}"
            if why:
                SERVICE_UNIT.report(s.out, s.layer.file, s.line("services", mine, i), f"services.{mine}[{i}]", why)
            else:
                units.append((i, unit))
    s.carry[f"services.{mine}"] = [u for _, u in units]
    for i, unit in units:
        table, opposite = s.merged.table(f"services.{mine}"), s.merged.table(f"services.{other}")
        table[unit] = Value(unit, s.source("services", mine, i))
        if unit in opposite:
            enabled, disabled = (table, opposite) if mine == "enable" else (opposite, table)
            SERVICE_BOTH.report(s.out, s.layer.file, s.line("services", mine, i), f"services.{mine}[{i}]",
                                f"conflict: {enabled[unit].source} enables {unit}, {disabled[unit].source} "
                                "disables it")


def read_services_enable(s: LayerScope) -> None:
    _services(s, "enable", "disable")


def read_services_disable(s: LayerScope) -> None:
    _services(s, "disable", "enable")


def read_env(s: LayerScope) -> None:
    items = []
    for key, raw in s.data["env"].items():
        line = s.line("env", key)
        value = s.text(str(raw), f"env.{key}", "env", key)
        if value is None or not one_line(s.out, s.layer.file, line, f"env.{key}", value):
            continue
        s.merged.scalar("env", key, Value(value, s.source("env", key)), s.layer.file, line)
        items.append((key, value))
    s.carry["env"] = items


def read_labels(s: LayerScope) -> None:
    for key, raw in s.data["labels"].items():
        value = s.text(str(raw), f"labels.{key}", "labels", key)
        if value is not None and one_line(s.out, s.layer.file, s.line("labels", key), f"labels.{key}", value):
            s.merged.scalar("labels", key, Value(value, s.source("labels", key)), s.layer.file, s.line("labels", key))


def _names_only(s: LayerScope, names: list[str], key: str) -> None:
    for i, p in enumerate(names):
        if not re.fullmatch(PKG_PATTERN, p):
            PACKAGE_NAME.report(s.out, s.layer.file, s.line("packages", key, i), f"packages.{key}[{i}]",
                                f"expected a Debian package name, found {p!r}")


def read_packages(s: LayerScope) -> None:
    """apt packages pinned by the lock; wheels fetched and checked against its sha256."""
    packages = s.render(kept(s, s.data["packages"]["apt"], "packages", "apt"), "packages", "apt")
    _names_only(s, packages, "apt")
    table = s.merged.table("packages")
    packages = [p for p in packages if p not in table]
    wheels = [w for w in s.render(s.data["packages"]["pip"], "packages", "pip") if w]
    for i, why in g.rendered_problems(g.PIP, wheels):  # rendered: a parameter must not bring a pip option
        PACKAGE_NAME.report(s.out, s.layer.file, s.line("packages", "pip", i), f"packages.pip[{i}]", why)
    target = s.text(s.data["packages"]["pip-target"], "packages.pip-target", "packages", "pip-target") or ""
    build_only = [WHEEL_TOOL] if wheels and WHEEL_TOOL not in packages else []
    pinned, is_locked = lockfile.pins(s.locked, s.name, packages + build_only)
    for i, p in enumerate(packages):
        table[p] = Value(pinned[i].partition("=")[2] or "*", s.source("packages", "apt"))
    locked_wheels = lockfile.wheels(s.locked, s.name)
    if wheels:
        is_locked = is_locked and lockfile.wheels_locked(s.locked, s.name, wheels)
        for w, info in locked_wheels.items():
            table[f"pip:{w}"] = Value(info["version"], s.source("packages", "pip"))
    s.carry.update(pinned=pinned, build_only=pinned[len(packages):], locked=is_locked,
                   wheels=wheels, wheel_target=target, locked_wheels=locked_wheels)


def read_holds(s: LayerScope) -> None:
    holds = s.render(kept(s, s.data["packages"]["hold"], "packages", "hold"), "packages", "hold")
    _names_only(s, holds, "hold")
    s.carry["holds"] = holds


def read_cut(s: LayerScope) -> None:
    s.carry["cut"] = s.data.get("cut")


def read_entrypoint(s: LayerScope) -> None:
    raw = s.data.get("entrypoint")
    rendered = s.render(raw, "entrypoint") if raw is not None else None
    for i, arg in enumerate(rendered or []):
        one_line(s.out, s.layer.file, s.line("entrypoint", i), f"entrypoint[{i}]", str(arg))
    s.carry["entrypoint"] = rendered
