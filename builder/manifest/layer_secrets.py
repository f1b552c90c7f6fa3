"""The root-file-system secret checks (checks.secrets: SSH host keys, a machine-id, private keys,
generated secrets and credential files) run on every layer of a built image on its own, not only
on the final tree: a file that a later layer removes is hidden from the final tree, and from every
check of it, but still shipped in its own layer (in `export oci` layouts and registries).

The layers are read from the engine's overlay2 directories where they are on this machine
(node.tree.layer_dirs), through `docker save` elsewhere. A clean layer is remembered by its engine
diff id (a content address: the verdict cannot go stale) and CHECK_VERSION, so a rebuild reads
only new layers and images that share layers read them once."""

from __future__ import annotations

import functools
import os
import stat
import tarfile
import tempfile
from pathlib import Path

import docker

from ..checks import secrets
from ..checks.registry import CHECKS
from ..engine.bootstrap import cache_dir
from ..errors import BuildFailed
from ..node.tree import layer_dirs
from . import oci_image

CHECK_VERSION = 1  # changes when checks.secrets finds more
Finding = tuple[str, str]  # (path in the layer, the check's name)


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(secrets.KEY_SCAN_MAX)
    except OSError:
        return b""


def scan_dir(top: Path) -> list[Finding]:
    """The secrets in one layer directory (an overlay2 diff directory: whiteouts are not files)."""
    found: list[Finding] = []
    for sub in secrets.KEY_DIRS:
        base = top / sub
        if base.is_symlink() or not base.is_dir():
            continue
        for dirpath, _, files in os.walk(base):  # links to directories are not followed
            for name in files:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = os.path.relpath(path, top)
                check = secrets.classify(rel, st.st_size, functools.partial(_head, path))
                if check:
                    found.append((rel, check))
    return sorted(found)


def scan_tar(path: Path) -> list[Finding]:
    """The secrets in one layer tar (`docker save`'s): the same test on its regular files."""
    found: list[Finding] = []
    with tarfile.open(path) as tar:
        for m in tar:
            rel = m.name.removeprefix("./")
            if not m.isreg() or rel.rsplit("/", 1)[-1].startswith(".wh."):
                continue

            def read(m: tarfile.TarInfo = m) -> bytes:
                f = tar.extractfile(m)
                return f.read(secrets.KEY_SCAN_MAX) if f else b""
            check = secrets.classify(rel, m.size, read)
            if check:
                found.append((rel, check))
    return sorted(found)


def _verdict(diff_id: str) -> Path:
    return cache_dir() / "layer-secrets" / f"{diff_id.removeprefix('sha256:')}-{CHECK_VERSION}"


def _scan_all(c: docker.DockerClient, ref: str, info: dict[str, object], todo: list[int]) -> dict[int, list[Finding]]:
    """Findings of the layers at the indexes todo (bottom first), from directories or `docker save`."""
    dirs = layer_dirs(info)  # top first
    diff_ids: list[str] = info["RootFS"]["Layers"]  # type: ignore[index]
    if dirs and len(dirs) == len(diff_ids):
        bottom_first = list(reversed(dirs))
        return {i: scan_dir(Path(bottom_first[i])) for i in todo}
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".layer-secrets-", dir=cache_dir()) as tmp:
        _, tars = oci_image.save(c, ref, Path(tmp))
        return {i: scan_tar(tars[i]) for i in todo}


def check(c: docker.DockerClient, ref: str, image: str) -> int:
    """Every layer of the engine image ref checked; BuildFailed names each secret, its layer and the
    check it fails. Returns how many layers were read (the others were known clean)."""
    info = c.api.inspect_image(ref)
    diff_ids: list[str] = info["RootFS"]["Layers"]
    todo = [i for i, d in enumerate(diff_ids) if not _verdict(d).exists()]
    if not todo:
        return 0
    findings = _scan_all(c, ref, info, todo)
    bad = []
    for i in todo:
        if not findings[i]:
            _verdict(diff_ids[i]).parent.mkdir(parents=True, exist_ok=True)
            _verdict(diff_ids[i]).touch()
            continue
        where = f"layer {i + 1} of {len(diff_ids)} ({diff_ids[i][:19]})"
        bad += [f"{where}: /{rel} [{name}]" for rel, name in findings[i]]
    if bad:
        names = sorted({b.rsplit("[", 1)[1].rstrip("]") for b in bad})
        raise BuildFailed(f"image {image}: a secret in a layer (a later layer may hide it from the final tree, "
                          "but the layer ships with the image):\n    " + "\n    ".join(bad)
                          + "\n    fix: remove it in the same step that makes it (a package's generated secret: "
                          "the package phase removes those in checks.secrets.GENERATED); "
                          + "; ".join(CHECKS[n].remedy for n in names if n in CHECKS))
    return len(todo)
