"""Stage 6: node images become disks. From the node image's file system: a GPT disk made
without mounting anything (ext4 with `mkfs.ext4 -d` straight into the disk file, the ESP with
mkfs.vfat and mtools, GRUB for BIOS written into its boot partition from Python), raw and qcow2,
and netboot artifacts (kernel, initrd, root archive, iPXE script) beside it.

The disk layout, fixed so that a disk is the same wherever it is built:

    1 MiB   GPT
    p1 1 MiB   BIOS boot (GRUB core.img)
    p2 64 MiB  EFI system partition (GRUB standalone BOOTX64.EFI)
    p3 rest    root ext4, found by its label
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker

from ..checks import rootfs as rootfs_checks
from ..definitions.quoting import Unquotable, cmdline_args, grub_word, grub_words, ipxe_word
from ..errors import BuildFailed, EnvironmentProblem
from ..plan import BuildPlan, digest
from ..progress import Progress, Timer

ASSEMBLER_VERSION = 2
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
MANIFEST = "node.json"
TOOLS = {"mkfs.ext4": "e2fsprogs", "mkfs.vfat": "dosfstools", "mcopy": "mtools", "mmd": "mtools",
         "sfdisk": "fdisk", "qemu-img": "qemu-utils", "grub-mkimage": "grub-common",
         "grub-mkstandalone": "grub-common"}


@dataclass
class NodeArtifacts:
    image: str
    key: str  # assembly key: content, command line, layout and formats
    content_key: str
    dir: str
    kernel_version: str
    cmdline: str  # the full command line the boot loaders pass, root= included
    root_label: str
    root_uuid: str
    disk_mib: int
    root_mib: int
    files: dict[str, str] = field(default_factory=dict)  # role -> file name in dir
    sha256: dict[str, str] = field(default_factory=dict)  # file name -> digest
    hygiene: list[str] = field(default_factory=list)  # what the rootfs checks found (checks.rootfs)
    cached: bool = False

    def path(self, role: str) -> Path:
        return Path(self.dir) / self.files[role]

    def has(self, role: str) -> bool:
        return role in self.files

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        return data


def output_dir(root: Path, image: str) -> Path:
    return root / "build" / "images" / image


def load(root: Path, image: str) -> NodeArtifacts | None:
    path = output_dir(root, image) / MANIFEST
    try:
        data = json.loads(path.read_text())
        data["dir"] = str(path.parent)
        return NodeArtifacts(**data)
    except (OSError, ValueError, TypeError):
        return None


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


def ipxe_script(art: NodeArtifacts, image: str, version: str, root_sha256: str) -> str:
    # iPXE has no quoting: every argument must be one word without ${ (ipxe_word refuses the rest)
    try:
        cmdline = " ".join(ipxe_word(a) for a in cmdline_args(art.cmdline) if not a.startswith("root=") and a != "ro")
    except Unquotable as e:
        raise BuildFailed(f"netboot of {image}: {e}; drop that kernel argument or the netboot format") from None
    return "\n".join([
        "#!ipxe",
        f"# nodeforge {' '.join(image.split())} {' '.join(version.split())} (assembly {art.key[:12]}): "
        "stateless netboot, root in RAM.",
        "# Serve this directory over HTTP and chain this script; base-url defaults to where it came from.",
        "isset ${base-url} || set base-url ${cwduri}",
        f"kernel ${{base-url}}/{art.files['kernel']} initrd={art.files['initrd']} {cmdline} boot=nodeforge-net "
        f"nodeforge.root=${{base-url}}/{art.files['rootfs']} nodeforge.root_sha256={root_sha256} ip=dhcp",
        f"initrd ${{base-url}}/{art.files['initrd']}",
        "boot", ""])


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None, **kw: Any) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, **kw)
    if p.returncode != 0:
        raise BuildFailed(f"{what} failed ({cmd[0]} exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")


def export_rootfs(c: docker.DockerClient, ref: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    container = c.api.create_container(ref, command=["/bin/true"])
    try:
        tar = subprocess.Popen(["tar", "-x", "-p", "--numeric-owner", "-C", str(dest)], stdin=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        assert tar.stdin
        for chunk in c.api.export(container["Id"]):
            tar.stdin.write(chunk)
        tar.stdin.close()
        err = tar.stderr.read().decode() if tar.stderr else ""
        if tar.wait() != 0:
            raise BuildFailed(f"unpacking the image's file system failed: {err.strip()[-400:]}")
    finally:
        c.api.remove_container(container["Id"], force=True)


def hygiene(rootfs: Path, image: str, progress: Progress) -> list[str]:
    """The named rootfs checks on the exported root: fixes applied and reported, a fatal one stops."""
    findings = rootfs_checks.run(rootfs)
    for f in findings:
        progress.say(image, f"check {f.render()}")
    fatal = [f for f in findings if f.action == "fatal"]
    if fatal:
        raise BuildFailed("; ".join(f"{f.found} [{f.check.name}]" for f in fatal)
                          + "\n    fix: " + "; ".join(f.check.remedy for f in fatal))
    return [f.render() for f in findings]


def used_mib(rootfs: Path) -> int:
    out = subprocess.run(["du", "-s", "-x", "--block-size=1M", str(rootfs)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0])


def root_size_mib(used: int, disk_mib: int | None) -> int:
    if disk_mib is not None:
        root = disk_mib - ROOT_START_MIB - 1
        if root < used + 64:
            raise BuildFailed(f"outputs.disk-size-mib {disk_mib} is too small: the root file system holds "
                              f"{used} MiB; set at least {used + 64 + ROOT_START_MIB + 1} or leave it unset")
        return root
    return used + max(256, used // 4)  # headroom: a quarter, at least 256 MiB


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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


def assembly_key(plan: BuildPlan, content_key: str) -> str:
    return digest({"assembler": ASSEMBLER_VERSION, "content": content_key, "cmdline": full_cmdline(plan),
                   "formats": plan.outputs.get("formats"), "disk": plan.outputs.get("disk-size-mib")})


def root_label(plan: BuildPlan) -> str:
    v = plan.params.get("kernel.root_label")
    return str(v.value) if v else "nodeforge-root"


def full_cmdline(plan: BuildPlan) -> str:
    return f"root=LABEL={root_label(plan)} ro {plan.cmdline}".strip()


def assemble(c: docker.DockerClient, plan: BuildPlan, ref: str, content_key: str, root: Path,
             progress: Progress) -> NodeArtifacts:
    """Make the disks and netboot artifacts of a node image; an unchanged image is not re-assembled."""
    name = plan.image
    out = output_dir(root, name)
    key = assembly_key(plan, content_key)
    previous = load(root, name)
    if previous and previous.key == key and all((out / f).exists() for f in previous.files.values()):
        previous.cached = True
        progress.say(name, f"assemble                          cached            {key[:12]}")
        return previous
    check_tools()
    formats = list(plan.outputs.get("formats") or [])
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}.assemble-", dir=out.parent))
    try:
        art = _assemble_into(c, plan, ref, content_key, key, work, formats, progress)
        if out.exists():
            for keep in ("sbom.spdx.json",):  # written by the build before assembly
                if (out / keep).exists():
                    os.replace(out / keep, work / keep)
            shutil.rmtree(out)
        shutil.rmtree(work / "rootfs")
        for tmp in ("esp.img", "core.img", "BOOTX64.EFI", "grub.cfg"):
            (work / tmp).unlink(missing_ok=True)
        os.chmod(work, 0o755)
        art.dir = str(out)
        (work / MANIFEST).write_text(json.dumps(art.to_json(), indent=2) + "\n")  # complete before it is visible
        os.replace(work, out)
        return art
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _assemble_into(c: docker.DockerClient, plan: BuildPlan, ref: str, content_key: str, key: str, work: Path,
                   formats: list[str], progress: Progress) -> NodeArtifacts:
    name = plan.image
    epoch = str(plan.base.epoch)

    def step(what: str, t: Timer) -> None:
        progress.say(name, f"assemble {what:<24} {t.seconds:6.1f}s")

    rootfs = work / "rootfs"
    with Timer() as t:
        export_rootfs(c, ref, rootfs)
    step("export file system", t)
    findings = hygiene(rootfs, name, progress)
    kver = rootfs_checks.kernels(rootfs)[0]
    used = used_mib(rootfs)
    root_mib = root_size_mib(used, plan.outputs.get("disk-size-mib"))
    disk_mib = ROOT_START_MIB + root_mib + 1  # the backup GPT lives in the last MiB
    art = NodeArtifacts(name, key, content_key, str(work), kver, full_cmdline(plan), root_label(plan),
                        _uuid(key, "root-fs"), disk_mib, root_mib, hygiene=findings)
    cfg = grub_config(art, name, plan.version)
    (work / "grub.cfg").write_text(cfg)

    disk = work / "disk.raw"
    with Timer() as t:
        _root_disk(disk, art, rootfs, key, epoch)
    step(f"root ext4 {root_mib} MiB ({used} used)", t)

    with Timer() as t:
        _boot_loaders(disk, work, key, epoch)
    step("GRUB for UEFI and BIOS", t)

    if "qcow2" in formats:
        with Timer() as t:
            _run(["qemu-img", "convert", "-O", "qcow2", str(disk), str(work / "disk.qcow2")], "qcow2 conversion")
        art.files["qcow2"] = "disk.qcow2"
        step("qcow2", t)
    if "raw" in formats:
        art.files["raw"] = "disk.raw"
    else:
        # keep a raw disk only when asked for; boots then use the qcow2
        disk.unlink()

    shutil.copyfile(rootfs / "boot" / f"vmlinuz-{kver}", work / "vmlinuz")
    shutil.copyfile(rootfs / "boot" / f"initrd.img-{kver}", work / "initrd.img")
    art.files.update(kernel="vmlinuz", initrd="initrd.img")
    root_sha = ""
    if "netboot" in formats:
        with Timer() as t:
            root_sha = _netboot(art, rootfs, work, plan, epoch)
        step("netboot artifacts", t)
    with Timer() as t:
        known = {"rootfs.tar.gz": root_sha} if "netboot" in formats else {}
        art.sha256 = {f: known.get(f) or sha256_file(work / f) for f in sorted(art.files.values())}
        (work / "SHA256SUMS").write_text("".join(f"{h}  {f}\n" for f, h in art.sha256.items()))
    step("checksums", t)
    return art


def _root_disk(disk: Path, art: NodeArtifacts, rootfs: Path, key: str, epoch: str) -> None:
    """The GPT and the root ext4, written straight into the disk file (mkfs.ext4 -d, nothing mounted)."""
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
    fs_uuid = art.root_uuid
    _run(["mkfs.ext4", "-q", "-F", "-L", art.root_label, "-U", fs_uuid, "-T", "default",
          "-E", f"root_owner=0:0,hash_seed={fs_uuid},offset={ROOT_START_MIB * MIB}",
          "-d", str(rootfs), str(disk), f"{art.root_mib}M"], "making the root file system",
         env={"E2FSPROGS_FAKE_TIME": epoch})


def _boot_loaders(disk: Path, work: Path, key: str, epoch: str) -> None:
    """A standalone GRUB on the ESP (mkfs.vfat and mtools) and GRUB's core.img in the BIOS boot partition."""
    efi = work / "BOOTX64.EFI"
    _run(["grub-mkstandalone", "-O", "x86_64-efi", "-o", str(efi), f"--modules={GRUB_MODULES}",
          f"--install-modules={GRUB_MODULES} efi_gop efi_uga all_video gzio", "--locales=", "--fonts=",
          "--themes=", f"boot/grub/grub.cfg={work / 'grub.cfg'}"], "making the UEFI boot loader")
    esp = work / "esp.img"
    esp_id = hashlib.sha256(f"{key}:esp-id".encode()).hexdigest()[:8]
    _run(["mkfs.vfat", "-C", "-F", "32", "-n", "ESP", "-i", esp_id, str(esp), str(ESP_MIB * 1024)],
         "making the EFI system partition")
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


def _netboot(art: NodeArtifacts, rootfs: Path, work: Path, plan: BuildPlan, epoch: str) -> str:
    """The root archive and boot.ipxe (which carries the archive's sha256); returns that sha256."""
    with (work / "rootfs.tar.gz").open("wb") as f:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "--sort=name",
                                f"--mtime=@{epoch}", "--xattrs", "-cf", "-", "."], stdout=subprocess.PIPE)
        gz = subprocess.run(["gzip", "-1", "-n"], stdin=tar.stdout, stdout=f)
        if tar.wait() != 0 or gz.returncode != 0:
            raise BuildFailed("making the root archive failed")
    art.files["rootfs"] = "rootfs.tar.gz"
    art.files["ipxe"] = "boot.ipxe"
    root_sha = sha256_file(work / "rootfs.tar.gz")
    (work / "boot.ipxe").write_text(ipxe_script(art, plan.image, plan.version, root_sha))
    return root_sha
