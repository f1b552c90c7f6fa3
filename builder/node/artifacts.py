"""What assembling a node image made: its outputs, their digests, and how the disk boots."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class NodeArtifacts:
    image: str
    key: str  # assembly key: content, command line, layout and formats
    content_key: str
    dir: str
    kernel_version: str
    cmdline: str  # the full command line the boot loaders pass, root= included
    root_label: str
    root_uuid: str
    disk_mib: int
    root_mib: int
    files: dict[str, str] = field(default_factory=dict)  # role -> file name in dir
    sha256: dict[str, str] = field(default_factory=dict)  # file name -> digest
    hygiene: list[str] = field(default_factory=list)  # what the rootfs checks found (checks.rootfs)
    cached: bool = False

    def path(self, role: str) -> Path:
        return Path(self.dir) / self.files[role]

    def has(self, role: str) -> bool:
        return role in self.files

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        data.pop("dir")  # where it lies: assemble.load sets it, and two build directories write the same file
        return data
