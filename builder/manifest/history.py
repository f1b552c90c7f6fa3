"""The previous manifests of an image, kept beside its current one (`build/images/<image>/history/`,
the last KEEP of them), so that `nodeforge diff IMAGE --previous` needs no copy made by hand.

Each build moves the manifest it replaces into history/ under the next number (a rename: atomic,
same directory tree) before it writes its own; a rebuild that writes the same bytes keeps none (the
previous manifest stays the last different build). The build directory is never tracked."""

from __future__ import annotations

import os
from pathlib import Path

DIR = "history"
KEEP = 5  # manifests kept per image


def _numbered(d: Path) -> list[tuple[int, Path]]:
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        stem = p.name.removesuffix(".json")
        if p.name.endswith(".json") and stem.isdigit() and p.is_file():
            out.append((int(stem), p))
    return sorted(out)


def rotate(current: Path, new: bytes) -> Path | None:
    """Move `current` (the manifest about to be replaced) into history/ unless it holds `new`
    already; drop all but the last KEEP. The kept path, or None."""
    try:
        old = current.read_bytes()
    except FileNotFoundError:
        return None
    if old == new:
        return None
    d = current.parent / DIR
    d.mkdir(exist_ok=True)
    kept = _numbered(d)
    target = d / f"{(kept[-1][0] + 1) if kept else 1:06d}.json"
    os.replace(current, target)
    for _, p in ([*kept, (0, target)])[:-KEEP]:
        p.unlink(missing_ok=True)
    return target


def previous(image_dir: Path) -> Path | None:
    """The manifest of the build before the current one, or None."""
    kept = _numbered(image_dir / DIR)
    return kept[-1][1] if kept else None
