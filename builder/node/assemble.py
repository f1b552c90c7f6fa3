"""Stage 6: node images become disks and netboot artifacts. The image's file system is mounted
from the engine's layers or exported (node.tree), checked (checks.rootfs), modules signed where a
key is given, then the formats asked for are made by the outputs table (node.outputs: the disk of
node.disk and its qcow2, the root archive and boot.ipxe of node.netboot), all at the same time,
each hashed as it is written where it can be; kernel, initramfs and SHA256SUMS beside them. An
unchanged image is not re-assembled (the assembly key)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker

from ..checks import rootfs as rootfs_checks
from ..compose.image import output_name
from ..engine import cancel
from ..engine.client import image_lock
from ..engine.steps import step_ref
from ..errors import BuildFailed, EnvironmentProblem
from ..paths import build_dir
from ..plan import BuildPlan, digest
from ..progress import Progress, Timer
from . import outputs, root_fs
from .archive import ChunkCache
from .artifacts import NodeArtifacts
from .disk import (  # noqa: F401  (re-exported: the node's layout and tools are asked for here)
    BIOS_START_MIB,
    ESP_START_MIB,
    GRUB_PC_DIR,
    MIB,
    ROOT_START_MIB,
    TYPE_BIOS,
    TYPE_ESP,
    TYPE_ROOT_X86_64,
    _run,
    _uuid,
    boot_loaders,
    check_tools,
    grub_config,
    serial_unit,
    sha256_file,
    write_bios_boot,
)
from .netboot import ipxe_script  # noqa: F401  (re-exported)
from .outputs import Making
from .signing import SigningKey, sign_modules
from .tree import MOUNTED, PackagePhase, image_tree, package_phase

ASSEMBLER_VERSION = 8  # 6: extended attributes (file capabilities) kept; 7: no baked-in resolv.conf;
# 8: the root ext4 in two phases (node.root_fs), its size in steps of 64 MiB
MANIFEST = "node.json"
ROOT_STEP_MIB = 64


def output_dir(root: Path, output: str) -> Path:
    """output: compose.image.output_name of the plan (NAME, or NAME@CONFIG for a config that changes
    the image): each (image, config) pair's outputs in a directory of their own."""
    return build_dir(root) / "images" / output


def load(root: Path, output: str) -> NodeArtifacts | None:
    path = output_dir(root, output) / MANIFEST
    try:
        data = json.loads(path.read_text())
        data["dir"] = str(path.parent)
        return NodeArtifacts(**data)
    except (OSError, ValueError, TypeError):
        return None


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
    headroom = used + max(256, used // 4)  # a quarter, at least 256 MiB; in steps that a small edit rarely crosses
    return -(-headroom // ROOT_STEP_MIB) * ROOT_STEP_MIB


def assembly_key(plan: BuildPlan, content_key: str, signing: SigningKey | None = None) -> str:
    inputs: dict[str, Any] = {"assembler": ASSEMBLER_VERSION, "content": content_key, "cmdline": full_cmdline(plan),
                              "formats": plan.outputs.get("formats"), "disk": plan.outputs.get("disk-size-mib")}
    if signing:  # the certificate, never the key: signed and unsigned assemblies are told apart
        inputs["module-signing"] = signing.fingerprint
    return digest(inputs)


def root_label(plan: BuildPlan) -> str:
    v = plan.params.get("kernel.root_label")
    return str(v.value) if v else "nodeforge-root"


def full_cmdline(plan: BuildPlan) -> str:
    return f"root=LABEL={root_label(plan)} ro {plan.cmdline}".strip()


def assemble(c: docker.DockerClient, plan: BuildPlan, ref: str, content_key: str, root: Path,
             progress: Progress, signing: SigningKey | None = None) -> NodeArtifacts:
    """Make the disks and netboot artifacts of a node image; an unchanged image is not re-assembled.
    signing: the module-signing key (--secret module-signing=PATH), used on the exported tree only."""
    name, output = plan.image, output_name(plan)
    out = output_dir(root, output)
    key = assembly_key(plan, content_key, signing)
    previous = load(root, output)
    if previous and previous.key == key and all((out / f).exists() for f in previous.files.values()):
        previous.cached = True
        progress.say(name, f"assemble                          cached            {key[:12]}")
        return previous
    check_tools()
    formats = list(plan.outputs.get("formats") or [])
    out.parent.mkdir(parents=True, exist_ok=True)
    cancel.check()
    work = Path(tempfile.mkdtemp(prefix=f".{output}.assemble-", dir=out.parent))
    # removed by the CLI when this thread is stopped before it gets to it (engine.cancel)
    tokens = [cancel.register(work), cancel.register(work.with_name(work.name + ".previous"))]
    dropping = _drop_previous(out, work)
    try:
        phase_ref = step_ref(plan.install.key) if plan.install else None
        with image_tree(c, ref, work) as (rootfs, how), \
                (package_phase(c, ref, phase_ref, work) if phase_ref and how == MOUNTED
                 else contextlib.nullcontext()) as phase:
            if phase is not None:  # as clean as the final tree: no build record reaches the disk's free blocks
                rootfs_checks.run(phase.tree)
            chunks = ChunkCache(build_dir(root) / "cache" / "archive-chunks")
            art = _assemble_into(plan, rootfs, how, content_key, key, work, formats, progress, signing, chunks,
                                 root, phase)
        dropping.join()
        for tree_dir in ("rootfs", "upper", "overlay-work", "phase-rootfs", "phase-upper", "phase-overlay-work"):
            shutil.rmtree(work / tree_dir, ignore_errors=True)
        for tmp in ("esp.img", "core.img", "BOOTX64.EFI", "grub.cfg"):
            (work / tmp).unlink(missing_ok=True)
        os.chmod(work, 0o755)
        art.dir = str(out)
        (work / MANIFEST).write_text(json.dumps(art.to_json(), indent=2) + "\n")  # complete before it is visible
        os.replace(work, out)
        return art
    finally:
        dropping.join()
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
        for token in tokens:
            cancel.unregister(token)


def remove_strays(root: Path) -> list[str]:
    """What a killed build (SIGKILL, a power cut) left in the build directory: assembly directories
    (.<image>[@<config>].assemble-*, and their .previous), each with the overlay mounts under it. Only
    those of images whose build lock (one per image, whatever the config) no one holds (a running
    build's directory is its own). Their names, relative to the build directory."""
    images = build_dir(root) / "images"
    removed: list[str] = []
    for d in sorted(images.glob(".*.assemble-*")) if images.is_dir() else []:
        image = d.name[1:].partition(".assemble-")[0].partition("@")[0]
        try:
            with image_lock(root, image, wait=False):
                if _unmount_all(d):  # never removed through a mount
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(str(d.relative_to(build_dir(root))))
        except EnvironmentProblem:
            continue  # a build of that image runs
    return removed


def _unmount_all(d: Path) -> bool:
    """Unmount every mount at or under d, the deepest first; whether none is left."""
    for point in _mounts_under(d):
        cancel.unmount(point)
    return not _mounts_under(d)


def _mounts_under(d: Path) -> list[Path]:
    real = Path(os.path.realpath(d))
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = [Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f[4]))
              for f in (line.split() for line in lines) if len(f) > 4]
    return sorted((p for p in points if p == real or real in p.parents), key=lambda p: len(p.parts), reverse=True)


def _drop_previous(out: Path, work: Path) -> threading.Thread:
    """The previous outputs out of the way (what the build wrote before assembly kept) and removed
    in a thread while the new ones are made: a failed assembly leaves none, never a mix."""
    trash = None
    if out.exists():
        for keep in ("sbom.spdx.json",):  # written by the build before assembly
            if (out / keep).exists():
                os.replace(out / keep, work / keep)
        trash = work.with_name(work.name + ".previous")
        os.replace(out, trash)
    thread = threading.Thread(target=shutil.rmtree, args=(trash, True), name="nodeforge-drop-previous")
    if not trash:
        thread = threading.Thread(name="nodeforge-nothing-to-drop")
    thread.start()
    return thread


def _assemble_into(plan: BuildPlan, rootfs: Path, how: str, content_key: str, key: str, work: Path,
                   formats: list[str], progress: Progress, signing: SigningKey | None,
                   chunks: ChunkCache, root: Path, phase: PackagePhase | None) -> NodeArtifacts:
    name = plan.image

    def step(what: str, t: Timer, how: str = "") -> None:
        progress.say(name, f"assemble {what:<24} {t.seconds:6.1f}s" + (f" ({how})" if how else ""))
        progress.output(name, f"{what}: done")

    source = "the engine's layers, nothing copied" if how == MOUNTED else "through the engine API"
    progress.say(name, f"assemble file system              {how} ({source})")
    findings = hygiene(rootfs, name, progress)
    kver = rootfs_checks.kernels(rootfs)[0]
    if signing:
        signed = sign_modules(rootfs, kver, signing)
        progress.say(name, f"signed {len(signed)} modules with {signing.subject} ({signing.fingerprint[:12]})")
    used = used_mib(rootfs)
    root_mib = root_size_mib(used, plan.outputs.get("disk-size-mib"))
    disk_mib = ROOT_START_MIB + root_mib + 1  # the backup GPT lives in the last MiB
    art = NodeArtifacts(name, key, content_key, str(work), kver, full_cmdline(plan), root_label(plan),
                        root_fs.fs_uuid(plan.install.key if plan.install else key, root_mib, root_label(plan)),
                        disk_mib, root_mib, hygiene=findings)
    make_outputs(Making(art, rootfs, work, plan.version, str(plan.base.epoch), root, chunks, phase, step), formats)
    with Timer() as t:
        (work / "SHA256SUMS").write_text("".join(f"{h}  {f}\n" for f, h in art.sha256.items()))
    step("checksums", t)
    return art


def make_outputs(m: Making, formats: Iterable[str]) -> None:
    """The loop over the outputs table: every format asked for made by its maker, each in a thread
    of its own, and the kernel and initramfs copied beside them meanwhile; then the node record's
    files and their sha256s (those a maker took on the way, the rest read here)."""
    art, chosen = m.art, outputs.selected(formats)
    art.files.update(outputs.KERNEL)
    for output in chosen:
        art.files.update(output.files)
    with ThreadPoolExecutor(max_workers=max(1, len(chosen)), thread_name_prefix="nodeforge-assemble") as pool:
        made = [pool.submit(output.make, m) for output in chosen]
        shutil.copyfile(m.rootfs / "boot" / f"vmlinuz-{art.kernel_version}", m.path("kernel"))
        shutil.copyfile(m.rootfs / "boot" / f"initrd.img-{art.kernel_version}", m.path("initrd"))
        known = {f: sha for future in made for f, sha in future.result().items()}
    disk = m.work / outputs.DISK
    if disk.exists() and disk.name not in art.files.values():
        disk.unlink()  # the disk formats were made from it; kept only when raw was asked for
    art.sha256 = {f: known.get(f) or sha256_file(m.work / f) for f in sorted(art.files.values())}
