"""Build phases, in the order the engine runs them (mkosi: packages, then extra trees, then
scripts; diskimage-builder's phase directories):

1. packages: one step for the whole image. Every layer's apt and dpkg configuration, repositories
   and keyrings (files with phase packages), one `apt-get update`, one install of every layer's
   locked packages, then in layer order each layer's wheels, holds and `phase: packages` steps, and
   last the secrets well-known packages generate at install (SSH host keys, munge's key, ssl-cert's
   snakeoil key, the machine-id: checks.secrets.GENERATED), removed in this same layer.
   Its key holds only what affects it, so a value edit in a file, sysctl, module option or service
   never re-runs a package install. In a node image update-initramfs is diverted to a no-op here:
   package postinsts and triggers generate no initramfs along the way.
2. config: one step per layer, in layer order: the layer's other files, then its users,
   ownership, services and `phase: config` steps (so steps keep their order relative to their own
   layer's files). Cheap to re-apply.
3. initramfs (node images): generated once, after the last config step, cached on exactly its
   inputs (engine.initramfs).
4. boot configuration (node images): one step nodeforge makes itself, after the initramfs, with
   every layer's typed contributions that only the booted node reads: the sysctl files
   (systemd-sysctl applies them at boot) and the kernel-argument files (the boot loader's command
   line is made from the plan). Nothing in the build reads them, so they depend on nothing but
   their values, and nothing depends on them: a sysctl or kernel-argument edit rebuilds this one
   step (a copy of a few files), never a layer's step or the initramfs. The rule it rests on: no
   layer step can see them (a step that must read a sysctl value reads it as a parameter). In a
   container image (which boots nothing) they are files of their layer's config step.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from ..checks import secrets
from ..debian import APT_INSTALL
from ..definitions.load import BOOT_PHASE, PACKAGE_PHASE
from ..plan import BOOT_FILES, CONFIG_FILES, PACKAGE_FILES, BuildPlan, LayerStep, digest

DIVERTED = "/usr/sbin/update-initramfs"
DIVERT_TO = "/usr/sbin/update-initramfs.nodeforge"

_DIVERT = [
    "# node image: no initramfs while packages install (it is generated once, after the last layer)",
    f"if ! dpkg-divert --list {DIVERTED} | grep -q nodeforge; then",
    f"  dpkg-divert --local --rename --divert {DIVERT_TO} --add {DIVERTED}",
    "fi",
    f"printf '%s\\n' '#!/bin/sh' 'echo \"update-initramfs: deferred by nodeforge until the last layer\" >&2' "
    f"> {DIVERTED}",
    f"chmod 0755 {DIVERTED}",
]


# what the install leaves that no one reads in an image: the package caches and lists, apt's and
# dpkg's logs of the build, and the backups dpkg and debconf keep of their databases (each a copy,
# about 1 MB, in every engine layer that ran apt)
CLEAN_LINES = ["apt-get clean", "rm -rf /var/lib/apt/lists/* /var/log/apt/*",
               "rm -f /var/log/dpkg.log /var/log/alternatives.log /var/lib/dpkg/*-old /var/cache/debconf/*-old"]


def _head(summary: str) -> list[str]:
    return [f"# {summary}", "set -euo pipefail", "export DEBIAN_FRONTEND=noninteractive"]


def _pinned(steps: list[LayerStep]) -> list[str]:
    """Every layer's locked packages, once each (a later layer's pin of the same name wins)."""
    by_name: dict[str, str] = {}
    for s in steps:
        for p in s.packages:
            by_name.pop(p.partition("=")[0], None)
            by_name[p.partition("=")[0]] = p
    return list(by_name.values())


def install_script(steps: list[LayerStep], node: bool) -> str:
    """The package phase of an image: empty when no layer installs anything."""
    packages = _pinned(steps)
    tail = [line for s in steps if s.install for line in
            (f"# layer {s.layer}: wheels, holds and package-phase steps", s.install.rstrip("\n"))]
    if not packages and not tail:
        return ""
    lines = _head("nodeforge package phase: every layer's packages")
    if node:
        lines += _DIVERT
    if packages:
        lines += ["apt-get update -q", f"{APT_INSTALL} \\\n    " + " \\\n    ".join(shlex.quote(p) for p in packages)]
    lines += tail
    lines += secrets.removal_lines()  # in this layer: no layer of the image carries them
    lines += CLEAN_LINES
    return "\n".join(lines) + "\n"


def standalone_install(step: LayerStep) -> str:
    """One layer's package phase on its own (the Packer export applies layers one by one)."""
    return install_script([step], node=False)


def _file_entries(step: LayerStep, phase: str) -> list[tuple[str, str, str, str, str]]:
    return [(f.path, f.mode, f.owner, f.group, f.sha256) for f in step.files if f.phase == phase]


def _as_config(step: LayerStep) -> LayerStep:
    if not any(f.phase == BOOT_FILES for f in step.files):
        return step
    files = tuple(dataclasses.replace(f, phase=CONFIG_FILES) if f.phase == BOOT_FILES else f for f in step.files)
    return dataclasses.replace(step, files=files)


def assign_keys(base_key: str, steps: list[tuple[LayerStep, dict[str, Any]]], node: bool
                ) -> tuple[LayerStep | None, list[LayerStep], LayerStep | None]:
    """The package step, every layer's config step and a node's boot configuration step, each with its
    content key. Each entry of steps is a layer's step (key not yet set) and what its lock entry and
    wheels put into the package key."""
    if not node:  # only a node boots: a container's sysctl and kernel-argument files are config files
        steps = [(_as_config(s), extra) for s, extra in steps]
    layers = [s for s, _ in steps]
    script = install_script(layers, node)
    install = None
    parent = base_key
    if script:
        files = tuple(f for s in layers for f in s.files if f.phase == PACKAGE_FILES)
        inputs = {"parent": base_key, "phase": "packages", "script": script,
                  "layers": [{"layer": s.layer, "files": _file_entries(s, PACKAGE_FILES), **extra}
                             for s, extra in steps]}
        install = LayerStep(PACKAGE_PHASE, "one apt transaction for every layer, before any layer's files",
                            digest(inputs), files, script, (), tuple(_pinned(layers)), all(s.locked for s in layers),
                            tuple(w for s in layers for w in s.wheels))
        parent = install.key
    keyed = []
    for s in layers:
        inputs = {"parent": parent, "phase": "config", "layer": s.layer, "apply": s.apply, "env": list(s.env),
                  "files": _file_entries(s, CONFIG_FILES)}
        if s.entrypoint is not None:
            inputs["entrypoint"] = list(s.entrypoint)
        if s.cut is not None:  # the image's whole environment is written again on the empty base
            inputs["cut"] = [s.cut, *(f"{k}={v}" for k, v in s.env)]
        if s.host_sources:  # what the source holds (its list's sha256), never where the build host keeps it
            inputs["host_sources"] = [[h.param, h.sums_sha256, h.mount] for h in s.host_sources]
        s = dataclasses.replace(s, key=digest(inputs))
        keyed.append(s)
        parent = s.key
    boot = None
    boot_files = tuple(f for s in keyed for f in s.files if f.phase == BOOT_FILES)
    if boot_files:
        inputs = {"parent": parent, "phase": "boot",
                  "files": [[s.layer, *entry] for s in keyed for entry in _file_entries(s, BOOT_FILES)]}
        boot = LayerStep(BOOT_PHASE, "every layer's sysctl and kernel arguments: read only by the booted node",
                         digest(inputs), boot_files, "", (), (), True)
    return install, keyed, boot


def boot_step_key(plan: BuildPlan, after: str) -> str:
    """The engine key of a node's boot configuration step built on the step keyed `after`: the
    plan's own key of it where it follows the last layer step, else chained on that step (the
    initramfs step)."""
    assert plan.boot is not None
    return plan.boot.key if after == plan.layers_key else digest({"after": after, "boot": plan.boot.key})


def engine_steps(plan: BuildPlan) -> list[LayerStep]:
    """What the engine builds before a node's initramfs, in order: the package step, then each layer's
    config step with only its config-phase files (its packages and package files are in the package
    step, its boot files in plan.boot, built after the initramfs)."""
    steps = [plan.install] if plan.install else []
    for s in plan.steps:
        steps.append(dataclasses.replace(s, files=tuple(f for f in s.files if f.phase == CONFIG_FILES),
                                         packages=(), wheels=(), install=""))
    return steps
