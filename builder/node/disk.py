"""The disk of a node image, made without mounting anything: the GPT (sfdisk on a file), the
root ext4 written straight into the disk file (mkfs.ext4 -d), the ESP (mkfs.vfat and mtools) with a
standalone GRUB for UEFI, and GRUB for BIOS written into its boot partition from Python.

The layout, fixed so that a disk is the same wherever it is built:

    1 MiB   GPT
    p1 1 MiB   BIOS boot (GRUB core.img)
    p2 64 MiB  EFI system partition (GRUB standalone BOOTX64.EFI)
    p3 rest    root ext4, found by its label
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..definitions.quoting import cmdline_args, grub_word, grub_words
from ..errors import BuildFailed, EnvironmentProblem
from ..plan import sha256_file  # noqa: F401  (the assembler's checksums)

if TYPE_CHECKING:
    from .artifacts import NodeArtifacts

MIB = 1 << 20
BIOS_START_MIB, BIOS_MIB = 1, 1
ESP_START_MIB, ESP_MIB = 2, 64
ROOT_START_MIB = ESP_START_MIB + ESP_MIB
TYPE_BIOS = "21686148-6449-6E6F-744E-656564454649"
TYPE_ESP = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
TYPE_ROOT_X86_64 = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
GRUB_MODULES = "part_gpt ext2 search search_label linux normal serial echo test"
GRUB_PC_DIR = Path("/usr/lib/grub/i386-pc")
GRUB_EFI_DIR = Path("/usr/lib/grub/x86_64-efi")
TOOLS = {"mkfs.ext4": "e2fsprogs", "mkfs.vfat": "dosfstools", "mcopy": "mtools", "mmd": "mtools",
         "sfdisk": "fdisk", "qemu-img": "qemu-utils", "grub-mkimage": "grub-common", "debugfs": "e2fsprogs"}


def check_tools() -> None:
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if not (GRUB_PC_DIR / "boot.img").exists():
        missing.append("grub-pc-bin")
    if not GRUB_EFI_DIR.exists():
        missing.append("grub-efi-amd64-bin")
    if missing:
        raise EnvironmentProblem(f"assembling node disks needs {', '.join(missing)}; run `make setup`")


def _uuid(key: str, role: str) -> str:
    return str(uuid.UUID(hex=hashlib.sha256(f"{key}:{role}".encode()).hexdigest()[:32], version=4))


def serial_unit(cmdline: str) -> tuple[int, int] | None:
    for arg in cmdline.split():
        if arg.startswith("console=ttyS"):
            dev, _, opts = arg[len("console=ttyS"):].partition(",")
            speed = "".join(ch for ch in opts if ch.isdigit()) or "115200"
            return int(dev or 0), int(speed[:6])
    return None


def grub_config(art: NodeArtifacts, image: str, version: str) -> str:
    serial = serial_unit(art.cmdline)
    lines = []  # embedded in the boot loader (not read from the disk); early configs know no comments
    if serial:
        lines += [f"serial --unit={serial[0]} --speed={serial[1]}", "terminal_input serial console",
                  "terminal_output serial console"]
    # every value a GRUB word of its own, in GRUB's single quotes where it needs them: a kernel
    # argument with ; $ or a quote reaches the kernel as written and never as GRUB syntax
    kver = art.kernel_version
    lines += [f"search --no-floppy --label --set=root {grub_word(art.root_label)}",
              f"echo {grub_word(f'nodeforge: booting {image} {version} ({kver})')}",
              f"linux {grub_word(f'/boot/vmlinuz-{kver}')} {grub_words(cmdline_args(art.cmdline))}",
              f"initrd {grub_word(f'/boot/initrd.img-{kver}')}",
              "boot", ""]
    return "\n".join(lines)


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None, **kw: Any) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, **kw)
    if p.returncode != 0:
        raise BuildFailed(f"{what} failed ({cmd[0]} exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")


def write_bios_boot(disk: Path, core: bytes) -> None:
    """What grub-bios-setup does for a GPT disk with a BIOS boot partition, without a device:
    boot.img's code into the MBR (keeping the protective partition table) pointing at core.img,
    and core.img's first-sector block list pointing at the rest of itself."""
    boot = bytearray((GRUB_PC_DIR / "boot.img").read_bytes())
    start = BIOS_START_MIB * MIB // 512
    if len(core) > BIOS_MIB * MIB:
        raise BuildFailed(f"GRUB core.img is {len(core)} bytes; the BIOS boot partition holds {BIOS_MIB} MiB")
    boot[0x5C:0x64] = struct.pack("<Q", start)  # GRUB_BOOT_MACHINE_KERNEL_SECTOR
    boot[0x66:0x68] = b"\x90\x90"  # hard disk: skip the floppy drive check (as grub-bios-setup does)
    core_img = bytearray(core)
    struct.pack_into("<Q", core_img, 0x200 - 12, start + 1)  # diskboot.img's block list: the sectors after it
    with disk.open("r+b") as f:
        f.seek(0)
        f.write(boot[:440])
        f.seek(start * 512)
        f.write(core_img)


def root_disk(disk: Path, art: NodeArtifacts, rootfs: Path, key: str, epoch: str) -> None:
    """The GPT and the root ext4, written straight into the disk file (mkfs.ext4 -d, nothing mounted)."""
    partition(disk, art, key)
    make_root_fs(disk, art, rootfs, epoch, ROOT_START_MIB * MIB)


def partition(disk: Path, art: NodeArtifacts, key: str) -> None:
    """A sparse disk file of the image's size with its GPT."""
    disk.touch()
    os.truncate(disk, art.disk_mib * MIB)
    table = "\n".join([
        "label: gpt", f"label-id: {_uuid(key, 'disk')}", "unit: sectors", "",
        f"start={BIOS_START_MIB * 2048}, size={BIOS_MIB * 2048}, type={TYPE_BIOS}, "
        f"uuid={_uuid(key, 'bios')}, name=bios-boot",
        f"start={ESP_START_MIB * 2048}, size={ESP_MIB * 2048}, type={TYPE_ESP}, uuid={_uuid(key, 'esp')}, "
        "name=esp",
        f"start={ROOT_START_MIB * 2048}, size={art.root_mib * 2048}, type={TYPE_ROOT_X86_64}, "
        f"uuid={_uuid(key, 'root')}, name=root", ""])
    _run(["sfdisk", "-q", "--no-reread", "--no-tell-kernel", str(disk)], "partitioning", input=table)


def make_root_fs(target: Path, art: NodeArtifacts, rootfs: Path, epoch: str, offset: int = 0) -> None:
    """The root ext4 of `rootfs` written into `target` at offset (a disk, or a file of its own)."""
    fs_uuid = art.root_uuid
    extended = f"root_owner=0:0,hash_seed={fs_uuid}" + (f",offset={offset}" if offset else "")
    _run(["mkfs.ext4", "-q", "-F", "-L", art.root_label, "-U", fs_uuid, "-T", "default", "-E", extended,
          "-d", str(rootfs), str(target), f"{art.root_mib}M"], "making the root file system",
         env={"E2FSPROGS_FAKE_TIME": epoch})
    normalise_times(target, offset, rootfs, int(epoch))


def copy_sparse(src: Path, dst: Path, offset: int) -> None:
    """src's data (not its holes) into dst at offset, inside the kernel."""
    with src.open("rb") as fi, dst.open("r+b") as fo:
        size = os.fstat(fi.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fi.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole remains
                break
            end = os.lseek(fi.fileno(), start, os.SEEK_HOLE)
            while start < end:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), end - start, start, offset + start)
                if n <= 0:
                    raise BuildFailed(f"copying {src.name} into {dst.name} stopped at byte {start}")
                start += n
            pos = end


def time_commands(rootfs: Path, epoch: int) -> list[str]:
    """debugfs commands that give every inode of the tree its mtime clamped to epoch, and that as
    its atime and ctime too (mkfs.ext4 -d copies the tree's atime and ctime: when it was unpacked).
    Grouped by directory (cd, then names relative to it): a third of the time of full paths, each
    looked up from the root. A name debugfs cannot take quoted keeps its times (none in a Debian
    tree); so does everything under a directory whose path it cannot take."""
    def quotable(text: str) -> bool:  # inside double quotes debugfs takes a backslash as it is
        return '"' not in text and "\n" not in text

    def fields(target: str, path: str) -> list[str]:
        t = min(int(os.lstat(path).st_mtime), epoch)
        return [f'sif "{target}" {field} @{t}' for field in ("mtime", "atime", "ctime")]

    cmds = fields("/", str(rootfs))
    for dirpath, dirnames, filenames in os.walk(rootfs):
        rel = os.path.relpath(dirpath, rootfs)
        inside = "/" if rel == "." else f"/{rel}"
        if not quotable(inside):
            continue
        cmds.append(f'cd "{inside}"')
        for name in sorted(dirnames + filenames):
            if quotable(name):
                cmds.extend(fields(name, os.path.join(dirpath, name)))
    return cmds


def debugfs(image: str, commands: list[str], epoch: int, script: Path) -> list[str]:
    """Run the commands with `debugfs -w` on image (a file, or file?offset=N), its clock at epoch
    (the superblock's last write time, when it writes one); what it complained of, empty when it
    took every command (debugfs exits 0 whatever a command did: only its messages tell)."""
    script.write_text("\n".join(commands) + "\n")
    try:
        p = subprocess.run(["debugfs", "-w", "-f", str(script), image], capture_output=True, text=True,
                           env={**os.environ, "E2FSPROGS_FAKE_TIME": str(epoch)})
    finally:
        script.unlink(missing_ok=True)
    complaints = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("debugfs ")]
    return complaints or ([f"exit {p.returncode}"] if p.returncode != 0 else [])


def normalise_times(disk: Path, offset: int, rootfs: Path, epoch: int) -> None:
    """The times of the root ext4 (inside the disk file at offset) made independent of the build."""
    # the superblock's lifetime write count too: it depends on how the writes went, not on the content
    commands = ["ssv kbytes_written 0", *time_commands(rootfs, epoch)]
    complaints = debugfs(f"{disk}?offset={offset}" if offset else str(disk), commands, epoch,
                         disk.with_name(".debugfs-times"))
    if complaints:
        raise BuildFailed("fixing the root file system's times failed (debugfs): " + "; ".join(complaints[:5]))


def boot_loaders(disk: Path, work: Path, key: str, epoch: str) -> None:
    """GRUB for UEFI on the ESP (mkfs.vfat and mtools) and GRUB's core.img in the BIOS boot partition:
    both images with the configuration embedded and the modules built in (grub-mkimage; unlike
    grub-mkstandalone, whose memdisk carries the build's times, the same bytes on every build)."""
    efi = work / "BOOTX64.EFI"
    _run(["grub-mkimage", "-O", "x86_64-efi", "-o", str(efi), "-c", str(work / "grub.cfg"), "-p", "/boot/grub",
          *GRUB_MODULES.split(), "efi_gop", "efi_uga", "all_video", "gzio"], "making the UEFI boot loader")
    esp = work / "esp.img"
    esp_id = hashlib.sha256(f"{key}:esp-id".encode()).hexdigest()[:8]
    _run(["mkfs.vfat", "--invariant", "-C", "-F", "32", "-n", "ESP", "-i", esp_id, str(esp), str(ESP_MIB * 1024)],
         "making the EFI system partition", env={"SOURCE_DATE_EPOCH": epoch})
    mtools_env = {"MTOOLS_SKIP_CHECK": "1", "SOURCE_DATE_EPOCH": epoch}
    _run(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"], "writing the ESP", env=mtools_env)
    _run(["mcopy", "-i", str(esp), str(efi), "::/EFI/BOOT/BOOTX64.EFI"], "writing the ESP", env=mtools_env)
    with disk.open("r+b") as dst, esp.open("rb") as src:
        dst.seek(ESP_START_MIB * MIB)
        shutil.copyfileobj(src, dst, 4 * MIB)
    core = work / "core.img"
    _run(["grub-mkimage", "-O", "i386-pc", "-o", str(core), "-c", str(work / "grub.cfg"), "-p", "/boot/grub",
          "biosdisk", *GRUB_MODULES.split()], "making the BIOS boot loader")
    write_bios_boot(disk, core.read_bytes())
