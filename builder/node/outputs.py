"""The outputs table: one entry per node output format named in builder.plan.FORMATS. An entry
says how the format is made (its maker), which files it leaves in the node record (role -> file
name), which boot modes of verify.boot boot it, as what qemu drive, and whether `export packer`
starts from it. A new format (VHD, a UKI) is its name in FORMATS, one entry here and one maker;
tests/unit/test_outputs.py binds the names to the entries, and shows a format added.

The makers of an assembly run at the same time, each in a thread (node.assemble.make_outputs): the
root archive is made while the disk is. The disk formats share one raw disk (Making.disk), made by
the first that asks for it; the assembler drops it at the end unless raw was asked for."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import plan
from ..definitions import tables
from ..progress import Timer
from . import root_fs
from .archive import ChunkCache, root_archive
from .disk import _run, boot_loaders, grub_config, sha256_file
from .netboot import ipxe_script

if TYPE_CHECKING:
    from .artifacts import NodeArtifacts
    from .tree import PackagePhase

DISK = "disk.raw"  # the raw disk every disk format starts from
KERNEL = {"kernel": "vmlinuz", "initrd": "initrd.img"}  # beside every format: direct and netboot boots start them


def _quiet(what: str, t: Timer, how: str = "") -> None:
    pass


@dataclass
class Making:
    """What a maker is given: the node record (art.files already names every file it is to write,
    in work), the image's file system, and the assembly's inputs. A maker returns the sha256s it
    took on the way (file name -> digest); the assembler hashes the rest of its files."""
    art: NodeArtifacts
    rootfs: Path
    work: Path
    version: str
    epoch: str
    root: Path  # the project root: the build directory's caches
    chunks: ChunkCache
    phase: PackagePhase | None = None
    step: Callable[..., None] = _quiet  # step(what, timer, how=""): a progress line
    _disk: Future[Path] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def path(self, role: str) -> Path:
        return self.work / self.art.files[role]

    def disk(self) -> Path:
        """The raw disk (GPT, root ext4, boot loaders), made once by the first maker that asks."""
        with self._lock:
            first = self._disk is None
            if self._disk is None:
                self._disk = Future()
            made = self._disk
        if first:
            try:
                made.set_result(self._make_disk())
            except BaseException as e:
                made.set_exception(e)
                raise
        return made.result()

    def _make_disk(self) -> Path:
        disk, art = self.work / DISK, self.art
        (self.work / "grub.cfg").write_text(grub_config(art, art.image, self.version))
        with Timer() as t:
            how = root_fs.write(disk, art, self.rootfs, art.key, self.epoch, self.root, self.phase)
        self.step(f"root ext4 {art.root_mib} MiB", t, how)
        with Timer() as t:
            boot_loaders(disk, self.work, art.key, self.epoch)
        self.step("GRUB for UEFI and BIOS", t)
        return disk


Maker = Callable[[Making], dict[str, str]]


@dataclass(frozen=True)
class Output:
    name: str  # as in outputs.formats
    make: Maker
    files: Mapping[str, str]  # role in the node record -> file name
    boots: tuple[str, ...] = ()  # the boot modes (verify.boot) that boot it
    drive: str | None = None  # qemu's format for it, when the disk modes attach it as the boot drive
    packer: bool = False  # export packer's base disk


def make_raw(m: Making) -> dict[str, str]:
    disk = m.disk()
    return {disk.name: sha256_file(disk)}


def make_qcow2(m: Making) -> dict[str, str]:
    target = m.path("qcow2")
    disk = m.disk()
    with Timer() as t:
        # no flush at the end (cache mode unsafe): like every other output, written through the page cache
        _run(["qemu-img", "convert", "-t", "unsafe", "-O", "qcow2", str(disk), str(target)], "qcow2 conversion")
    m.step("qcow2", t)
    return {target.name: sha256_file(target)}


def make_netboot(m: Making) -> dict[str, str]:
    """The root archive, hashed as it is written, and boot.ipxe, which carries its sha256."""
    with Timer() as t:
        root_sha, reuse = root_archive(m.rootfs, m.path("rootfs"), m.epoch, m.chunks, m.art.image)
        m.path("ipxe").write_text(ipxe_script(m.art, m.art.image, m.version, root_sha))
    m.step("netboot artifacts", t, f"root archive: {reuse}")
    return {m.art.files["rootfs"]: root_sha}


DISK_MODES = ("direct", "uefi", "bios")
OUTPUTS: dict[str, Output] = {o.name: o for o in (
    Output("raw", make_raw, {"raw": DISK}, boots=DISK_MODES, drive="raw"),
    Output("qcow2", make_qcow2, {"qcow2": "disk.qcow2"}, boots=DISK_MODES, drive="qcow2", packer=True),
    Output("netboot", make_netboot, {"rootfs": "rootfs.tar.gz", "ipxe": "boot.ipxe"}, boots=("netboot",)),
)}


def selected(formats: Iterable[str] | None) -> list[Output]:
    """The entries of these format names, in the table's order (the order they are listed in does
    not matter: the same node record for [qcow2, raw] as for [raw, qcow2])."""
    return [o for name, o in OUTPUTS.items() if name in set(formats or ())]


def booted(art: NodeArtifacts, mode: str) -> Output | None:
    """The output a boot mode boots: of those the node has, the last in the table; a disk format
    after raw is made from the raw disk, so booting it checks the conversion and the disk at once."""
    have = [o for o in OUTPUTS.values() if mode in o.boots and all(art.has(role) for role in o.files)]
    return have[-1] if have else None


def for_packer() -> Output:
    """The format `export packer` starts from (its base disk)."""
    (out,) = (o for o in OUTPUTS.values() if o.packer)
    return out


@contextlib.contextmanager
def registered(output: Output) -> Iterator[Output]:
    """A format added for the time of a with block, where a real one is written into the source:
    its name appended to plan.FORMATS and to the definitions' enum of formats (derived from
    FORMATS when it is imported), its entry to the table. Everything is put back on leaving."""
    if output.name in OUTPUTS:
        raise ValueError(f"output format {output.name!r} is already in the table")
    names, choices = plan.FORMATS, tables.FORMAT.choices
    plan.FORMATS, tables.FORMAT.choices = (*names, output.name), (*choices, output.name)
    OUTPUTS[output.name] = output
    try:
        yield output
    finally:
        del OUTPUTS[output.name]
        plan.FORMATS, tables.FORMAT.choices = names, choices
