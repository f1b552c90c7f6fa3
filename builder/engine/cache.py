"""Why a step was rebuilt: each build records a fingerprint of every layer step; the next build
compares against it and names what changed (files, apply script, packages, env, parent)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..definitions.documents import parse_json, read_bytes
from ..errors import UsageError
from ..paths import build_dir
from ..plan import LayerStep


def fingerprint(step: LayerStep, parent_key: str, parent_name: str) -> dict[str, Any]:
    return {
        "key": step.key, "parent": parent_key, "parent_name": parent_name,
        "apply": hashlib.sha256(step.apply.encode()).hexdigest(),
        "env": dict(step.env), "packages": list(step.packages),
        "files": {f.path: f"{f.mode} {f.owner}:{f.group} {f.sha256}" for f in step.files},
    }


def reason(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    if old is None:
        return "not built before"
    parts: list[str] = []
    of, nf = old.get("files", {}), new["files"]
    changed = sorted(p for p in set(of) | set(nf) if of.get(p) != nf.get(p))
    if changed:
        parts.append("files " + ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))
    if old.get("packages") != new["packages"]:
        a, b = set(old.get("packages", [])), set(new["packages"])
        parts.append("packages " + ", ".join(sorted(b - a) or sorted(a - b)))
    if old.get("apply") != new["apply"] and old.get("packages") == new["packages"]:
        parts.append("apply script")
    if old.get("env") != new["env"]:
        parts.append("env")
    if old.get("parent") != new["parent"]:
        parts.append(f"after {new['parent_name']}")
    return "changed: " + "; ".join(parts) if parts else "cache entry missing"


def _read_state(path: Path) -> dict[str, Any]:
    """The recorded fingerprints, or {} when there are none or they are unreadable (a FIFO, a
    directory, not JSON, not a mapping): they only explain a rebuild, the next build rewrites them."""
    try:
        data = parse_json(read_bytes(path, "build state", "the next build rewrites it"), path, "build state",
                          "the next build rewrites it")
    except UsageError:
        return {}
    return data if isinstance(data, dict) else {}


class State:
    """build/state/<image>.json: the fingerprints of the last successful build of an image."""

    def __init__(self, root: Path, image: str) -> None:
        self.path = build_dir(root) / "state" / f"{image}.json"
        self.old: dict[str, Any] = _read_state(self.path)
        self.new: dict[str, Any] = {}

    def previous(self, layer: str) -> dict[str, Any] | None:
        value = self.old.get(layer)
        return value if isinstance(value, dict) else None

    def record(self, layer: str, fp: dict[str, Any]) -> None:
        self.new[layer] = fp

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.new, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
