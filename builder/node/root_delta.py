"""The root file system's second phase: the changes made after the package phase, written into a
copy of the package phase's ext4 with debugfs instead of making the whole file system again.

What changed is read from the overlay directories above the package phase (the config layers,
the initramfs step, the assembly's own fixes): every name in them was written, replaced or
removed there. For each, the final tree (the merged view) says what it is now and the package
tree what the ext4 holds: a directory's names that the final tree lacks are removed (with
everything under them), a file, link or device is written anew, and every changed name gets the
final owner, mode, times (clamped to the epoch, as the first phase has them) and extended
attributes. The commands are grouped by directory (cd, then plain names): debugfs's `write` and
`mknod` take a name in the current directory only.

What this cannot write exactly (a name debugfs cannot quote, a socket, a symbolic link with
extended attributes, an overlay redirect or metadata-only copy) raises Unsupported: the caller
then makes the file system in one phase."""

from __future__ import annotations

import os
import stat
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
    return s.lines


def run(image: str, script: list[str], epoch: int, script_path: Path) -> None:
    """Run the commands on `image` (a file, or file?offset=N); any complaint of debugfs's fails."""
    complaints = debugfs(image, script, epoch, script_path)
    if complaints:
        raise Unsupported("debugfs: " + "; ".join(complaints[:5]))
