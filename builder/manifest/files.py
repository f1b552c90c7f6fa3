"""The manifest's `files` section: every file the image's layers write (files and templates of a
layer, its apply script's inputs excluded), with the layer that wrote it, its sha256 and mode; a
text file under /etc of at most TEXT_BYTES bytes is recorded with its lines, so that the diff of
two manifests shows the changed lines. Read from the plan (the build context each layer step
copies into the image), so it costs nothing and is as deterministic as the plan.

Not listed: what a layer's apply script or its packages change (the packages section names every
package; `nodeforge diff A B` of two built images compares their whole file systems). Files of the
images an image builds on come from the parent's manifest, marked with the image that wrote them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..plan import BuildPlan, ContextFile
from . import reader

TEXT_BYTES = 16 * 1024  # the largest /etc text file recorded with its lines
TEXT_LINES = 400  # and its most lines
TEXT_ROOT = "/etc/"


def _text(f: ContextFile) -> list[str] | None:
    """The lines of a small UTF-8 text file under /etc; None for any other file."""
    if not f.path.startswith(TEXT_ROOT):
        return None
    if f.content is not None:
        data = f.content.encode()
    elif f.source:
        try:
            with open(f.source, "rb") as src:
                data = src.read(TEXT_BYTES + 1)
        except OSError:
            return None
    else:
        return None
    if len(data) > TEXT_BYTES or b"\0" in data:
        return None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
    return lines if len(lines) <= TEXT_LINES else None


def _entry(f: ContextFile, layer: str, image: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": f.path, "layer": layer, "image": image, "sha256": f.sha256, "mode": f.mode}
    lines = _text(f)
    if lines is not None:
        entry["lines"] = lines
    return entry


def _layer_of(origin: str, fallback: str) -> str:
    """`layer NAME (file:line)` -> NAME."""
    head, _, rest = origin.partition(" ")
    return rest.split(" ", 1)[0] if head == "layer" and rest else fallback


def of_plan(plan: BuildPlan, inherited: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every file the image's layers write, sorted by path (one path has one writer: compose
    refuses a second), the parent's first."""
    out: dict[str, dict[str, Any]] = {f["path"]: {**f, "inherited": True} for f in inherited or []}
    install = plan.install.files if plan.install else ()
    for f in install:
        out[f.path] = _entry(f, _layer_of(f.origin, "packages"), plan.image)
    for step in plan.steps:
        for f in step.files:
            out[f.path] = _entry(f, step.layer, plan.image)
    return [out[p] for p in sorted(out)]


def parent_manifest(path: Path, key: str) -> dict[str, Any] | None:
    """The parent image's manifest, when it is the build of the key the image was built on."""
    if not path.is_file():
        return None
    try:
        doc = reader.read(path)
    except (UsageError, OSError):  # an unreadable parent manifest only leaves the keys unknown
        return None
    return doc if doc.get("plan_key") == key else None
