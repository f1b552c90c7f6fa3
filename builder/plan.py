"""The BuildPlan: frozen, JSON-serialisable, every step with a content key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLAN_FORMAT = 1

# The node output formats (outputs.formats; all of them by default), in the order of the outputs
# table, builder/node/outputs.py, which has one entry for each.
FORMATS: tuple[str, ...] = ("raw", "qcow2", "netboot")


def digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 4 MiB pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Value:
    """A merged value and where it came from."""

    value: Any
    source: str


@dataclass(frozen=True)
class ContextFile:
    path: str  # destination inside the image
    mode: str
    owner: str
    group: str
    sha256: str
    origin: str  # which layer file or contribution produced it
    content: str | None = None  # rendered text; None for a static file copied from `source`
    source: str | None = None  # absolute path of a static file
    phase: str = "config"  # one of FILE_PHASES


# where a file a layer writes is placed (compose.phases): before the package installs, in its layer's
# step, or in the boot configuration step after every layer step and the initramfs (nodes only)
PACKAGE_FILES, CONFIG_FILES, BOOT_FILES = "packages", "config", "boot"
FILE_PHASES = (PACKAGE_FILES, CONFIG_FILES, BOOT_FILES)


@dataclass(frozen=True)
class Test:
    name: str
    layer: str  # layer name, or "image:<name>"
    scope: str
    kind: str
    spec: dict[str, Any]
    requires: tuple[str, ...]
    file: str
    line: int | None


@dataclass(frozen=True)
class HostSource:
    """A directory on the build host that a step sees read-only (compose.host_sources)."""

    param: str  # layer.param
    path: str  # the directory on the build host
    sums_sha256: str  # of its SHA256SUMS: what the step's key takes from it
    mount: str  # where the step sees it, read-only


@dataclass(frozen=True)
class LayerStep:
    layer: str
    summary: str
    key: str
    files: tuple[ContextFile, ...]
    apply: str  # the layer's apply script (bash); empty when the layer only writes files
    env: tuple[tuple[str, str], ...]
    packages: tuple[str, ...]  # name=version where locked
    locked: bool
    wheels: tuple[str, ...] = ()  # pip requirements, as written (the lock pins them)
    entrypoint: tuple[str, ...] | None = None  # ENTRYPOINT set by this layer
    install: str = ""  # package-phase lines after the apt install: wheels, holds, package-phase steps
    host_sources: tuple[HostSource, ...] = ()  # build-host directories its config step sees
    cut: str | None = None  # the image becomes this directory alone on an empty base (layer key `cut`)


@dataclass(frozen=True)
class Base:
    kind: str  # "debian" or "image"
    key: str
    debian: dict[str, Any] | None  # suite, mirror, components, variant, include
    image: str | None  # parent image name
    epoch: int


@dataclass(frozen=True)
class BuildPlan:
    format: int
    image: str
    kind: str
    version: str
    summary: str
    config: str | None
    base: Base
    steps: tuple[LayerStep, ...]
    tags: tuple[str, ...]
    labels: dict[str, str]  # layer and image labels (the OCI ones are added at build time)
    env: dict[str, Value]
    params: dict[str, Value]  # layer.param -> value
    sysctl: dict[str, Value]
    kernel_args: tuple[Value, ...]
    modules: tuple[Value, ...]
    modprobe: dict[str, Value]  # module.option -> value
    blacklist: tuple[Value, ...]
    services_enabled: tuple[Value, ...]
    services_disabled: tuple[Value, ...]
    packages: dict[str, Value]  # name -> version (or "*" unlocked), source layer
    files: dict[str, Value]  # path -> sha256, source
    tests: tuple[Test, ...]
    outputs: dict[str, Any]
    inherited_layers: tuple[str, ...]
    user: str | None = None  # default USER of the final image (not inherited by child images)
    sets: tuple[str, ...] = ()  # the --set arguments it was composed with (recorded on the built image)
    install: LayerStep | None = None  # the package phase: every layer's packages in one step (compose.phases)
    boot: LayerStep | None = None  # a node's boot configuration: every layer's sysctl and kernel arguments

    @property
    def key(self) -> str:
        """Content key of the image's file system: its boot configuration step's, else its last layer step's."""
        return self.boot.key if self.boot else self.layers_key

    @property
    def layers_key(self) -> str:
        """The key of the last layer step (what a node's initramfs step builds on)."""
        if self.steps:
            return self.steps[-1].key
        return self.install.key if self.install else self.base.key

    @property
    def build_command(self) -> str:
        """The command that builds this plan: its image with the config and --set values it was composed with."""
        words = ["nodeforge", "build", f"images/{self.image}.yaml", *(["-c", self.config] if self.config else [])]
        return shlex.join([*words, *(w for s in self.sets for w in ("--set", s))])

    @property
    def cmdline(self) -> str:
        return " ".join(v.value for v in self.kernel_args)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["key"] = self.key
        return data
