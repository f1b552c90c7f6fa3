"""The table of contribution kinds (the way mkosi drives parser, CLI and docs from one settings table).

Each kind declares once: the key it reads in layer.yaml, how a layer's value is read, rendered,
checked and merged (its handler, in compose.handlers), the BuildPlan field it fills, how a child
image inherits it, how `plan --explain` shows it and how `nodeforge diff` finds it in a built
image. Handlers run in table order, and that order is the order of the files in each step (part of
the step key): append new kinds at the end of the file-writing ones or after them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..checks.registry import check
from ..debian import parse_dpkg_status
from ..plan import BuildPlan, Value
from . import handlers as h
from .scope import LayerScope, Merged, conflict_check, karg_key


class ImageFacts(Protocol):
    """What `nodeforge diff` reads from a built image."""

    env: dict[str, str]
    labels: dict[str, str]
    files: dict[str, tuple[str, str]]  # path -> (mode or "link", sha256 or link target)
    texts: dict[str, str]  # configuration files kept whole


@dataclass(frozen=True)
class Diffed:
    title: str
    keep: str  # regex of the files whose text the extractor reads
    extract: Callable[[ImageFacts], dict[str, str] | set[str]]


@dataclass(frozen=True)
class Kind:
    key: str  # where it sits in layer.yaml (and its name)
    doc: str
    read: Callable[[LayerScope], None]
    field: str | None = None  # the BuildPlan field it fills
    shape: str = "map"  # map (key -> Value) | list (tuple of Values) | plain (key -> value) | none
    explain: str | None = None  # section title of `plan --explain`
    diff: Diffed | None = None
    inherit: Callable[[Merged, str, Any, BuildPlan], None] | None = None
    conflicts: bool = False  # a key set twice to different values is a conflict (a named check)

    def plan_value(self, merged: Merged) -> Any:
        table = merged.table(self.key)
        if self.shape == "list":
            return tuple(table.values())
        if self.shape == "plain":
            return {k: v.value for k, v in table.items()}
        return dict(table)


def _conf_lines(folder: str) -> Callable[[ImageFacts], set[str]]:
    def extract(img: ImageFacts) -> set[str]:
        return {line.strip() for path, text in img.texts.items() if re.match(folder, path)
                for line in text.splitlines() if line.strip() and not line.startswith("#")}
    return extract


def _sysctl_of(img: ImageFacts) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(p for p in img.texts if re.match(r"(etc|usr/lib)/sysctl\.d/.*\.conf$", p)):
        for line in img.texts[path].splitlines():
            line = line.strip()
            if line and not line.startswith(("#", ";")) and "=" in line:
                k, _, v = line.partition("=")
                out[k.strip()] = " ".join(v.split())
    return out


def _kernel_args_of(img: ImageFacts) -> set[str]:
    return {a for line in _conf_lines(r"etc/nodeforge/kernel-cmdline\.d/")(img) for a in line.split()}


def _packages_of(img: ImageFacts) -> dict[str, str]:
    status = parse_dpkg_status(img.texts.get("var/lib/dpkg/status", ""))
    return {k: v.get("Version", "") for k, v in status.items()}


def _services_of(img: ImageFacts) -> set[str]:
    return {p.split("/", 3)[-1] for p in img.files if re.match(r"etc/systemd/system/[^/]+\.wants/", p)}


VOLATILE_LABELS = ("org.opencontainers.image.revision",)


def _tag(parent: BuildPlan, v: Value) -> Value:
    return Value(v.value, v.source if v.source.startswith("image ") else f"image {parent.image}: {v.source}")


def _inherit_map(merged: Merged, key: str, value: Any, parent: BuildPlan) -> None:
    merged.table(key).update({k: _tag(parent, v) for k, v in value.items()})


def _inherit_list(merged: Merged, key: str, value: Any, parent: BuildPlan) -> None:
    merged.table(key).update({v.value: _tag(parent, v) for v in value})


def _inherit_kargs(merged: Merged, key: str, value: Any, parent: BuildPlan) -> None:
    """Keyed as Merged.karg keys them: by name, a repeated argument (console=) by the whole argument,
    so that the parent's console=tty0 console=ttyS0,... both reach the child, in order."""
    merged.table(key).update({karg_key(v.value): _tag(parent, v) for v in value})


def _inherit_labels(merged: Merged, key: str, value: Any, parent: BuildPlan) -> None:
    merged.table(key).update({k: Value(v, f"image {parent.image}") for k, v in value.items()})


MODPROBE_D = r"etc/modprobe\.d/"
KINDS: tuple[Kind, ...] = (
    Kind("files", "files written into the image, from templates, static files or inline content", h.read_files,
         "files", explain="files", inherit=_inherit_map, conflicts=True),
    Kind("packages.repos", "extra signed apt repositories: a sources file and a keyring", h.read_repos),
    Kind("sysctl", "kernel parameters in /etc/sysctl.d/90-nodeforge-<layer>.conf", h.read_sysctl, "sysctl",
         explain="sysctl", diff=Diffed("sysctl", r"(etc|usr/lib)/sysctl\.d/", _sysctl_of), inherit=_inherit_map,
         conflicts=True),
    Kind("kernel.args", "kernel command line arguments, checked against a table of known parameters",
         h.read_kernel_args, "kernel_args", "list", "kernel command line",
         Diffed("kernel arguments", r"etc/nodeforge/kernel-cmdline\.d/", _kernel_args_of), _inherit_kargs),
    Kind("kernel.blacklist", "modules kept from loading (modprobe.d, and the initramfs through it)",
         h.read_blacklist, "blacklist", "list", "modules blacklisted", inherit=_inherit_list),
    Kind("kernel.modprobe", "module options in /etc/modprobe.d/nodeforge-<layer>.conf", h.read_modprobe, "modprobe",
         explain="module options", diff=Diffed("module options and blacklist", MODPROBE_D, _conf_lines(MODPROBE_D)),
         inherit=_inherit_map, conflicts=True),
    Kind("kernel.modules", "modules loaded at boot (/etc/modules-load.d)", h.read_modules, "modules", "list",
         "modules loaded", Diffed("modules loaded", r"etc/modules-load\.d/", _conf_lines(r"etc/modules-load\.d/")),
         _inherit_list),
    Kind("services.enable", "systemd units enabled", h.read_services_enable, "services_enabled", "list",
         "services enabled", Diffed("services enabled", r"^$", _services_of), _inherit_list),
    Kind("services.disable", "systemd units disabled", h.read_services_disable, "services_disabled", "list",
         "services disabled", inherit=_inherit_list),
    Kind("env", "image environment variables", h.read_env, "env", explain="env",
         diff=Diffed("env", r"^$", lambda img: dict(img.env)), inherit=_inherit_map, conflicts=True),
    Kind("labels", "image labels", h.read_labels, "labels", "plain",
         diff=Diffed("labels", r"^$", lambda img: {k: v for k, v in img.labels.items() if k not in VOLATILE_LABELS}),
         inherit=_inherit_labels, conflicts=True),
    Kind("packages", "Debian packages (packages.apt: names, versions from the lock) and wheels (packages.pip)",
         h.read_packages, "packages", explain="packages",
         diff=Diffed("packages", r"var/lib/dpkg/status$", _packages_of), inherit=_inherit_map),
    Kind("packages.hold", "packages kept at their locked version (apt-mark hold)", h.read_holds),
    Kind("entrypoint", "the image's ENTRYPOINT", h.read_entrypoint),
    Kind("cut", "a final image cut from the full one: the directory the layer assembles, alone", h.read_cut),
)

for _kind in KINDS:
    if _kind.conflicts:
        check(conflict_check(_kind.key), "compose", f"two layers set one {_kind.key} entry to different values",
              "set it in one layer only, or make it a parameter and set it in the config")


def kind(key: str) -> Kind:
    return next(k for k in KINDS if k.key == key)


def inherit(merged: Merged, parent: BuildPlan) -> None:
    """A child image starts from its parent's merged tables, each value tagged with the parent."""
    for k in KINDS:
        if k.field and k.inherit:
            k.inherit(merged, k.key, getattr(parent, k.field), parent)


def plan_fields(merged: Merged) -> dict[str, Any]:
    return {k.field: k.plan_value(merged) for k in KINDS if k.field}


def read_layer(s: LayerScope) -> None:
    for k in KINDS:
        k.read(s)
