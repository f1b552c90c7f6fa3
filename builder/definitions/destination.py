"""Where a command writes a directory of outputs (`render`, `export oci`, `export packer`): outputs
never overwrite inputs. One rule for all of them:

- never the project tree (the root holding layers/, images/, configs/), a directory above it, or a
  directory inside it other than under build/;
- never a symbolic link, a file, or an existing directory the same command did not make for the
  same subject (its marker file says which); an empty directory holds nothing to lose;
- the outputs are written into a temporary directory beside the destination and renamed into
  place once complete: a failure leaves the destination as it was and no temporary behind.

Entries of an old destination that the command does not write itself (a Packer build's output
directory in a Packer export) are carried into the new one, not deleted."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError
from . import documents


def marker_name(command: str) -> str:
    """`.nodeforge-render`, `.nodeforge-export-oci`, ..."""
    return ".nodeforge-" + command.replace(" ", "-")


def _marker_text(command: str, subject: str) -> str:
    return f"made by nodeforge {command} of {subject}; {command} replaces this directory whole\n"


def _made_by(dest: Path, command: str) -> str | None:
    """The subject the marker in dest names ('' for a marker of another shape); None: no marker."""
    marker = dest / marker_name(command)
    if not marker.is_file() or marker.is_symlink():
        return None
    text = documents.read_bytes(marker, "marker", "remove it", limit=4096).decode(errors="replace")
    head = f"made by nodeforge {command} of "
    first = text.split("\n", 1)[0]
    return first[len(head):].split(";", 1)[0] if first.startswith(head) else ""


def check(dest: Path, project: Path | None, command: str, subject: str | None = None) -> None:
    """Refuse a destination the rule above forbids (subject None: a marker of any subject will do)."""
    real = dest.resolve()
    if project is not None:
        root = project.resolve()
        if real == root or root.is_relative_to(real):
            raise UsageError(f"{command}: {dest} is the project tree or holds it; give a new directory")
        if real.is_relative_to(root) and not real.is_relative_to(root / "build"):
            raise UsageError(f"{command}: {dest} is inside the project tree; give a directory outside it or "
                             "under build/")
    if not dest.is_symlink() and not dest.exists():
        return
    if dest.is_symlink() or not dest.is_dir():
        raise UsageError(f"{command}: {dest} exists and is not a directory `nodeforge {command}` made; it is "
                         "left as it is: give a new directory")
    made = _made_by(dest, command)
    if made is None and not any(dest.iterdir()):
        return
    if made is None:
        raise UsageError(f"{command}: {dest} exists and was not made by `nodeforge {command}`; it is left as it "
                         "is: give a new directory or remove it yourself")
    if subject is not None and made != subject:
        raise UsageError(f"{command}: {dest} was made by `nodeforge {command}` of {made or 'something else'}, "
                         f"not of {subject}; it is left as it is: give another directory or remove it yourself")


def _swap(tmp: Path, dest: Path, keep: Callable[[str], bool]) -> None:
    """dest replaced by tmp; the entries of the old dest that `keep` names move across."""
    aside = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    old = aside / "old"
    try:
        if os.path.lexists(dest):
            os.replace(dest, old)
            for entry in sorted(old.iterdir()):
                if keep(entry.name) and not os.path.lexists(tmp / entry.name):
                    os.replace(entry, tmp / entry.name)
        try:
            os.replace(tmp, dest)
        except OSError:
            if old.exists():  # put back what was there, carried entries included
                for entry in sorted(tmp.iterdir()):
                    if keep(entry.name) and not os.path.lexists(old / entry.name):
                        os.replace(entry, old / entry.name)
                os.replace(old, dest)
            raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def replacing(dest: Path, project: Path | None, command: str, subject: str,
              keep: Callable[[str], bool] = lambda name: False) -> Iterator[Path]:
    """A temporary directory beside dest to write the outputs into; renamed to dest (with the
    command's marker) when the block ends without an error, removed otherwise."""
    check(dest, project, command, subject)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{marker_name(command)[1:]}-", dir=dest.parent))
    except OSError as e:
        raise UsageError(f"{command}: cannot write beside {dest} ({e.strerror}); give a directory you can "
                         "write to") from None
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        (tmp / marker_name(command)).write_text(_marker_text(command, subject))
        check(dest, project, command, subject)  # nothing else appeared there meanwhile
        _swap(tmp, dest, keep)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
