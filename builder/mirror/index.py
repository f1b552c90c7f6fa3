"""A mirror's index, nodeforge-mirror.json: every file of the mirror with its sha256 and size, the
packages (name, version -> the .deb, or the base that already holds it), the wheels, the bases and
the lock of each image it was made from. `check` verifies every file before a build uses any."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..plan import sha256_file

INDEX = "nodeforge-mirror.json"
FORMAT = 1




@dataclass
class Index:
    # image -> {"lock_sha256", "base"}
    images: dict[str, dict[str, str]] = field(default_factory=dict)
    # base key -> file (relative)
    bases: dict[str, str] = field(default_factory=dict)
    # package -> version -> {"file", "sha256_from": lock|download} or {"in_base": key}
    packages: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    # wheel name -> version -> {"file", "sha256"}
    wheels: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    # relative path -> {"sha256", "size"}
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_file(self, root: Path, rel: str, sha256: str | None = None) -> str:
        path = root / rel
        digest = sha256 or sha256_file(path)
        self.files[rel] = {"sha256": digest, "size": path.stat().st_size}
        return digest

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "images": self.images, "bases": self.bases, "packages": self.packages,
                "wheels": self.wheels, "files": dict(sorted(self.files.items()))}

    def write(self, root: Path) -> None:
        (root / INDEX).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")


def _bad(root: Path, what: str) -> UsageError:
    return UsageError(f"mirror {root}: {what}; make it again with `nodeforge mirror IMAGE... DIR` "
                      "where the network is, and carry it over whole")


def read(root: Path) -> Index:
    """The index of a mirror directory, without checking the files."""
    path = root / INDEX
    if not root.is_dir():
        raise UsageError(f"--mirror {root}: no such directory; make one with `nodeforge mirror IMAGE... DIR`")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise _bad(root, f"no readable index {INDEX} ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _bad(root, f"{INDEX} is not a nodeforge mirror index of format {FORMAT}")
    return Index(data.get("images", {}), data.get("bases", {}), data.get("packages", {}), data.get("wheels", {}),
                 data.get("files", {}))


def _present(root: Path) -> set[str]:
    found = set()
    for d, _, names in os.walk(root):
        for n in names:
            rel = str((Path(d) / n).relative_to(root))
            if rel != INDEX:
                found.add(rel)
    return found


def check(root: Path) -> Index:
    """The index, once every file it lists has its sha256 and size and no other file is there;
    otherwise exit 2 naming the first files that differ."""
    index = read(root)
    problems = []
    present = _present(root)
    for rel in sorted(present - set(index.files)):
        problems.append(f"{rel}: not in the index")
    for rel, want in sorted(index.files.items()):
        path = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            problems.append(f"{rel}: a path outside the mirror")
        elif rel not in present:
            problems.append(f"{rel}: missing")
        elif path.stat().st_size != want.get("size") or sha256_file(path) != want.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the index")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise _bad(root, "the index check failed: " + "; ".join(problems[:5]) + more)
    return index
