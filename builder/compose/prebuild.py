"""Checks composing makes for what a build would otherwise reject minutes later: `validate` and
`plan` report them at once, each with its fix.

- services/systemd: a layer that enables or disables units needs systemctl in the image (the
  build's apply script stops with "services need systemd in the image")."""

from __future__ import annotations

import re

from .. import lockfile
from ..checks.registry import check
from ..definitions.load import Image
from ..errors import Collector
from ..plan import BuildPlan, Value
from .scope import Merged

SYSTEMD = check("services/systemd", "compose",
                "an image whose layers enable or disable systemd units has systemd (systemctl) installed",
                "add systemd-sysv (or systemd) to packages.apt, or guard the unit with "
                "{item: UNIT, when: \"{{ image.kind == 'node' }}\"} so that container images leave it out")

_SOURCE = re.compile(r"layer (\S+) \((.+?):(\d+)\)")
SYSTEMD_PACKAGES = ("systemd", "systemd-sysv")


def _installed(merged: Merged, locked: lockfile.Lock | None) -> set[str]:
    """Package names the image installs: every layer's own (inherited ones too) and, where the lock
    knows them, their dependencies."""
    names = {n for n in merged.table("packages") if not n.startswith("pip:")}
    if locked:
        for entry in locked.layers.values():
            names |= set(entry.get("deps", {})) | set(entry.get("direct", {}))
    return names


def _where(v: Value, image: Image) -> tuple[str, int | None]:
    m = _SOURCE.match(v.source)
    return (m.group(2), int(m.group(3))) if m else (image.file, image.line("layers"))


def check_prebuild(image: Image, merged: Merged, locked: lockfile.Lock | None, parent: BuildPlan | None,
                   out: Collector) -> None:
    installed = _installed(merged, locked)
    own = [v for k in ("services.enable", "services.disable") for v in merged.table(k).values()
           if v.source.startswith("layer ")]
    installed |= set(parent.packages) if parent else set()
    has_systemd = any(p in installed for p in SYSTEMD_PACKAGES) or bool(parent and parent.services_enabled)
    if own and not has_systemd:
        file, line = _where(own[0], image)
        units = ", ".join(v.value for v in own)
        SYSTEMD.report(out, file, line, "services",
                       f"image {image.name} ({image.data['kind']}) enables or disables {units}, but no layer "
                       "installs systemd: the build would stop with 'services need systemd in the image'")
