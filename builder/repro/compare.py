"""What differs between two builds, down to the file: two directories of outputs (tar, cpio
initramfs and ext4 images opened and compared file by file) or two OCI layouts (layer by layer).
diffoscope reports when it is installed; the built-in comparison otherwise."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import IO

from . import cpio, partitions
from .entry import Entry

MAX_LINES = 200  # per compared pair: enough to name what differs without flooding the terminal


def _layer(path: Path) -> IO[bytes]:
    """A layer blob as its tar: gzip-compressed (layouts of other tools) or not (nodeforge's)."""
    with path.open("rb") as f:
        magic = f.read(2)
    return gzip.open(path) if magic == b"\x1f\x8b" else path.open("rb")  # type: ignore[return-value]


def sha256_of(f: IO[bytes]) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def tar_entries(f: IO[bytes]) -> dict[str, Entry]:
    out = {}
    with tarfile.open(fileobj=f, mode="r:*") as t:
        for m in t:
            data = t.extractfile(m) if m.isreg() else None
            kind = "file" if m.isreg() else "dir" if m.isdir() else "link" if m.issym() else \
                "hardlink" if m.islnk() else "other"
            out[m.name.removeprefix("./").rstrip("/")] = Entry(kind, m.size if m.isreg() else 0, m.mode, int(m.mtime),
                                                               sha256_of(data) if data else "", m.linkname)
    return out


def tree_entries(root: Path) -> dict[str, Entry]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        name = str(p.relative_to(root))
        if p.is_symlink():  # a copied-out link's time is the copy's (debugfs and mtools cannot set it)
            out[name] = Entry("link", 0, st.st_mode & 0o7777, 0, "", str(p.readlink()))
        elif p.is_dir():
            out[name] = Entry("dir", 0, st.st_mode & 0o7777, int(st.st_mtime), "")
        elif p.is_file():
            with p.open("rb") as f:
                out[name] = Entry("file", st.st_size, st.st_mode & 0o7777, int(st.st_mtime), sha256_of(f))
        else:
            out[name] = Entry("other", 0, st.st_mode & 0o7777, int(st.st_mtime), "")
    return out


def ext4_entries(image: Path) -> dict[str, Entry]:
    """The files of an ext4 image, copied out with debugfs (no mount, no root needed for a file)."""
    if shutil.which("debugfs") is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="nodeforge-ext4-") as tmp:
        subprocess.run(["debugfs", "-R", f"rdump / {tmp}", str(image)], capture_output=True, check=False)
        return tree_entries(Path(tmp))


def is_ext4(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(1080)
        return f.read(2) == b"\x53\xef"


def is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile):
        return False


def entries_of(path: Path) -> dict[str, Entry] | None:
    """The files inside an archive or filesystem image; None for any other file."""
    if cpio.is_initramfs(path):
        return cpio.entries(path.read_bytes())
    if partitions.is_gpt_disk(path):
        return partitions.disk_entries(path, tree_entries)
    if is_ext4(path):
        return ext4_entries(path)
    if is_tar(path):
        with path.open("rb") as f:
            return tar_entries(f)
    return None


def compare_entries(a: dict[str, Entry], b: dict[str, Entry]) -> list[str]:
    lines = []
    for name in sorted(set(a) | set(b)):
        ea, eb = a.get(name), b.get(name)
        if ea is None or eb is None:
            lines.append(f"only in {'B' if ea is None else 'A'}: {name}")
        elif ea != eb:
            lines += [f"differs: {name}", f"  A: {ea.describe()}", f"  B: {eb.describe()}"]
    return lines


def compare_files(a: Path, b: Path) -> list[str]:
    """Nothing when the two files are identical, else what differs inside them (or their hashes)."""
    with a.open("rb") as fa, b.open("rb") as fb:
        ha, hb = sha256_of(fa), sha256_of(fb)
    if ha == hb:
        return []
    inner_a, inner_b = entries_of(a), entries_of(b)
    if inner_a is not None and inner_b is not None:
        inside = compare_entries(inner_a, inner_b)
        if inside:
            return inside[:MAX_LINES] + ([f"... and {len(inside) - MAX_LINES} more"] if len(inside) > MAX_LINES else [])
    return [f"sha256 {ha[:16]} (A) vs {hb[:16]} (B), sizes {a.stat().st_size} and {b.stat().st_size}"]


def with_diffoscope(a: Path, b: Path) -> list[str] | None:
    """diffoscope's text report of two files or directories; None when it is not installed."""
    if shutil.which("diffoscope") is None:
        return None
    proc = subprocess.run(["diffoscope", "--text", "-", "--no-progress", str(a), str(b)],
                          capture_output=True, text=True)
    if proc.returncode == 0:
        return []
    return (proc.stdout or proc.stderr).splitlines()[:MAX_LINES * 5]


def compare_dirs(a: Path, b: Path, diffoscope: bool = True) -> list[str]:
    """Every output file of two builds: nothing when all are identical, else what differs."""
    names_a = {str(p.relative_to(a)) for p in a.rglob("*") if p.is_file()}
    names_b = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()}
    lines = [f"only in {'A' if n in names_a else 'B'}: {n}" for n in sorted(names_a ^ names_b)]
    for name in sorted(names_a & names_b):
        inside = compare_files(a / name, b / name)
        if inside:
            report = with_diffoscope(a / name, b / name) if diffoscope else None
            lines.append(f"{name} differs:")
            lines += ["  " + line for line in (report if report else inside)]
    return lines


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _manifest(layout: Path) -> dict[str, object]:
    index = json.loads((layout / "index.json").read_text())
    manifest: dict[str, object] = json.loads(_blob(layout, index["manifests"][0]["digest"]).read_text())
    return manifest


def compare_layouts(a: Path, b: Path, diffoscope: bool = True) -> list[str]:
    """Two normalised OCI layouts: nothing when the manifests are the same, else the config keys
    and, layer by layer, the files that differ."""
    ma, mb = _manifest(a), _manifest(b)
    if ma == mb:
        return []
    lines = []
    ca = json.loads(_blob(a, ma["config"]["digest"]).read_text())  # type: ignore[index]
    cb = json.loads(_blob(b, mb["config"]["digest"]).read_text())  # type: ignore[index]
    for key in sorted(set(ca) | set(cb)):
        if key != "rootfs" and ca.get(key) != cb.get(key):
            lines.append(f"config {key} differs")
    made_by = [h.get("created_by", "") for h in ca.get("history", []) if not h.get("empty_layer")]
    la, lb = ma["layers"], mb["layers"]
    assert isinstance(la, list) and isinstance(lb, list)
    if len(la) != len(lb):
        lines.append(f"{len(la)} layers (A) vs {len(lb)} (B)")
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x["digest"] == y["digest"]:
            continue
        report = with_diffoscope(_blob(a, x["digest"]), _blob(b, y["digest"])) if diffoscope else None
        with _layer(_blob(a, x["digest"])) as fa, _layer(_blob(b, y["digest"])) as fb:
            inside = report or compare_entries(tar_entries(fa), tar_entries(fb))
        step = f" ({made_by[i][:80]})" if i < len(made_by) and made_by[i] else ""
        lines.append(f"layer {i + 1}{step} differs:")
        lines += ["  " + line for line in inside[:MAX_LINES] or ["(the same files, different bytes)"]]
    return lines
