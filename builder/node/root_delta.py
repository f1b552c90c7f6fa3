"""The root file system's second phase: the changes made after the package phase, written into a
copy of the package phase's ext4 with debugfs instead of making the whole file system again.

What changed is read from the overlay directories above the package phase (the config layers,
the initramfs step, the assembly's own fixes): every name in them was written, replaced or
removed there. For each, the final tree (the merged view) says what it is now and the package
tree what the ext4 holds: a directory's names that the final tree lacks are removed (with
everything under them), a file, link or device is written anew, and every changed name gets the
final owner, mode, times (clamped to the epoch, as the first phase has them) and extended
attributes. The commands are grouped by directory (cd, then plain names): debugfs's `write` and
`mknod` take a name in the current directory only. A file whose every name is removed has its
data blocks zeroed first (zero_freed): debugfs frees blocks without clearing them, and what a later
layer removed must not stay in the disk's free space.

What this cannot write exactly (a name debugfs cannot quote, a socket, a symbolic link with
extended attributes, an overlay redirect or metadata-only copy) raises Unsupported: the caller
then makes the file system in one phase."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

from .disk import debugfs

# overlay features that put an entry's data or name somewhere else than its own path
_OVERLAY_INDIRECT = ("trusted.overlay.redirect", "trusted.overlay.metacopy")


class Unsupported(Exception):
    """A change the second phase cannot write exactly; the message says which."""


def _quotable(text: str) -> bool:  # inside double quotes debugfs takes every character but these
    return '"' not in text and "\n" not in text and "\0" not in text


def _q(text: str) -> str:
    if not _quotable(text):
        raise Unsupported(f"a name debugfs cannot quote: {text!r}")
    return f'"{text}"'


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class View:
    """A tree read by relative names, never through a symbolic link: a name whose parent is not a
    directory in this tree does not exist in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._is_dir: dict[str, bool] = {"": True}

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else str(self.root)

    def lstat(self, rel: str) -> os.stat_result | None:
        if rel and not self.is_dir(os.path.dirname(rel)):
            return None
        try:
            return os.lstat(self.path(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_dir(self, rel: str) -> bool:
        if rel not in self._is_dir:
            st = self.lstat(rel)
            self._is_dir[rel] = st is not None and stat.S_ISDIR(st.st_mode)
        return self._is_dir[rel]

    def names(self, rel: str) -> set[str]:
        return set(os.listdir(self.path(rel))) if self.is_dir(rel) else set()


def changed_names(diff_dirs: Iterable[Path]) -> set[str]:
    """Every name written, replaced or removed (an overlay whiteout) in the given layer directories."""
    out: set[str] = set()
    for top in diff_dirs:
        for dirpath, dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, top)
            base = "" if rel == "." else rel
            for name in (*dirnames, *filenames):
                full = os.path.join(dirpath, name)
                try:
                    attrs = os.listxattr(full, follow_symlinks=False)
                except OSError:
                    attrs = []
                if any(a.startswith(_OVERLAY_INDIRECT) for a in attrs):
                    raise Unsupported(f"{_join(base, name)}: an overlay redirect or metadata-only copy")
                out.add(_join(base, name))
    return out


class _Script:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cwd: str | None = None
        self.removed: list[tuple[str, os.stat_result]] = []  # regular files rm'd, as the package tree has them

    def at(self, rel: str, verb: str, after: str = "") -> None:
        """`verb "name" after`, run in the entry's parent directory (the root: by its full name)."""
        if not rel:
            self.lines.append(f'{verb} "/"{after}')
            return
        parent, name = os.path.split(rel)
        if parent != self._cwd:
            self.lines.append(f"cd {_q('/' + parent)}")
            self._cwd = parent
        self.lines.append(f"{verb} {_q(name)}{after}")


def _remove(s: _Script, pkg: View, rel: str) -> None:
    """Commands that remove `rel` as the package tree has it, everything under a directory first."""
    st = pkg.lstat(rel)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        for name in sorted(pkg.names(rel)):
            _remove(s, pkg, _join(rel, name))
        s.at(rel, "rmdir")
    else:
        if stat.S_ISREG(st.st_mode):
            s.removed.append((rel, st))
        s.at(rel, "rm")


def _metadata(s: _Script, rel: str, st: os.stat_result, epoch: int, final: View, scratch: Path) -> None:
    t = min(int(st.st_mtime), epoch)
    fields = [("mode", f"0{st.st_mode:o}"), ("uid", str(st.st_uid)), ("gid", str(st.st_gid)),
              ("mtime", f"@{t}"), ("atime", f"@{t}"), ("ctime", f"@{t}")]
    for field, value in fields:
        s.at(rel, "sif", f" {field} {value}")
    attrs = sorted(os.listxattr(final.path(rel), follow_symlinks=False))
    if attrs and stat.S_ISLNK(st.st_mode):
        raise Unsupported(f"{rel}: a symbolic link with extended attributes")
    for attr in attrs:
        if not attr.replace(".", "").replace("_", "").replace("-", "").isalnum():
            raise Unsupported(f"{rel}: extended attribute {attr!r}")
        stored = scratch / f"xattr-{len(s.lines)}"
        stored.write_bytes(os.getxattr(final.path(rel), attr, follow_symlinks=False))
        s.at(rel, f"ea_set -f {_q(str(stored))}", f" {attr}")


def commands(final: View, pkg: View, changed: set[str], epoch: int, scratch: Path) -> list[str]:
    """The debugfs commands that turn the package tree's ext4 into the final tree's. scratch: a
    directory for the extended attributes' values (debugfs reads them from files)."""
    return delta(final, pkg, changed, epoch, scratch)[0]


def delta(final: View, pkg: View, changed: set[str], epoch: int, scratch: Path) -> tuple[list[str], list[str]]:
    """(the debugfs commands, the files whose data they free: every name of theirs is removed)."""
    s = _Script()
    kept: list[tuple[str, os.stat_result]] = []
    first_name: dict[tuple[int, int], str] = {}
    links: dict[str, int] = {}
    for rel in sorted(changed | {""}, key=lambda p: p.split("/") if p else []):
        st = final.lstat(rel)
        if st is None:
            continue  # removed: its parent directory's names say so
        was = pkg.lstat(rel)
        if stat.S_ISDIR(st.st_mode):
            if was is not None and stat.S_ISDIR(was.st_mode):
                for gone in sorted(pkg.names(rel) - final.names(rel)):
                    _remove(s, pkg, _join(rel, gone))
            else:
                _remove(s, pkg, rel)
                s.at(rel, "mkdir")
            kept.append((rel, st))
            continue
        _remove(s, pkg, rel)
        if stat.S_ISREG(st.st_mode):
            inode = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and inode in first_name:  # another name of a file written above
                s.at(rel, f"ln {_q('/' + first_name[inode])}")
                links[first_name[inode]] += 1
                continue
            s.at(rel, f"write {_q(final.path(rel))}")
            if st.st_nlink > 1:
                first_name[inode], links[rel] = rel, 1
        elif stat.S_ISLNK(st.st_mode):
            s.at(rel, "symlink", f" {_q(os.readlink(final.path(rel)))}")
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
            s.at(rel, "mknod", f" {kind} {os.major(st.st_rdev)} {os.minor(st.st_rdev)}")
        elif stat.S_ISFIFO(st.st_mode):
            s.at(rel, "mknod", " p")
        else:
            raise Unsupported(f"{rel}: a socket")
        kept.append((rel, st))
    for rel, count in sorted(links.items()):
        if count > 1:
            s.at(rel, "sif", f" links_count {count}")
    for rel, st in kept:  # last: the commands above change their directories' times
        _metadata(s, rel, st, epoch, final, scratch)
    s.lines.append("ssv kbytes_written 0")  # how the writes went, not the content
    return s.lines, _freed(s.removed)


def _freed(removed: list[tuple[str, os.stat_result]]) -> list[str]:
    """One name of each file whose every name is removed (a file that keeps a name keeps its data)."""
    names: dict[tuple[int, int], set[str]] = {}
    links: dict[tuple[int, int], int] = {}
    for rel, st in removed:
        names.setdefault((st.st_dev, st.st_ino), set()).add(rel)
        links[(st.st_dev, st.st_ino)] = st.st_nlink
    return sorted(min(n) for inode, n in names.items() if len(n) >= links[inode])


_RANGE = re.compile(r"\((\d+)(?:-(\d+))?\):(\d+)(?:-(\d+))?")  # a data extent of `stat`; (ETB0), (IND) are not
_ZEROS = bytes(1 << 20)


def _sections(stdout: str) -> list[str]:
    """debugfs -f's output, one text per command (each starts with its `debugfs: ` echo)."""
    out: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("debugfs: "):
            out.append("")
        elif out:
            out[-1] += line + "\n"
    return out


def _data_runs(stat_text: str, block: int) -> list[tuple[int, int]]:
    """(byte offset, length) of each data extent `stat` lists."""
    runs = []
    for m in _RANGE.finditer(stat_text.partition("EXTENTS:")[2] or stat_text.partition("BLOCKS:")[2]):
        first = int(m.group(3))
        last = int(m.group(4)) if m.group(4) else first
        runs.append((first * block, (last - first + 1) * block))
    return runs


def zero_freed(disk: Path, offset: int, files: list[str], script_path: Path) -> int:
    """Zero the data of files (paths in the ext4 inside disk at offset) before the commands unlink
    them: debugfs's rm frees a file's blocks without clearing them, and what a later layer removed
    (a secret, a replaced configuration) would stay in the disk's free space. The bytes zeroed."""
    if not files:
        return 0
    script_path.write_text("\n".join(["stats", *(f"stat {_q('/' + rel)}" for rel in files)]) + "\n")
    try:
        p = subprocess.run(["debugfs", "-f", str(script_path), f"{disk}?offset={offset}"], capture_output=True,
                           text=True)
    finally:
        script_path.unlink(missing_ok=True)
    parts = _sections(p.stdout)
    size = re.search(r"^Block size:\s+(\d+)", parts[0] if parts else "", re.M)
    if p.returncode != 0 or len(parts) != len(files) + 1 or size is None:
        raise Unsupported(f"debugfs could not list the blocks of removed files: {p.stderr.strip()[-300:]}")
    if "inline_data" in parts[0]:
        raise Unsupported("inline data: a removed file's bytes would stay in its inode")
    zeroed = 0
    with disk.open("r+b") as f:
        for rel, text in zip(files, parts[1:], strict=True):
            if "Size of inline data" in text or "Type: regular" not in text:
                raise Unsupported(f"{rel}: its data cannot be zeroed before removal")
            for start, length in _data_runs(text, int(size.group(1))):
                for pos in range(start, start + length, len(_ZEROS)):
                    n = min(len(_ZEROS), start + length - pos)
                    os.pwrite(f.fileno(), _ZEROS[:n], offset + pos)
                zeroed += length
    return zeroed


def run(image: str, script: list[str], epoch: int, script_path: Path) -> None:
    """Run the commands on `image` (a file, or file?offset=N); any complaint of debugfs's fails."""
    complaints = debugfs(image, script, epoch, script_path)
    if complaints:
        raise Unsupported("debugfs: " + "; ".join(complaints[:5]))
