"""`nodeforge export packer IMAGE DIR`: the node build as a Packer template, for pipelines (and
cloud builders) that run Packer. Packer's qemu builder starts from a disk nodeforge assembles -
the image's bootstrap and every layer up to the kernel, plus SSH access for Packer only - and
applies the remaining layers, rendered exactly as the engine build uses them, as provisioners.
The last provisioner regenerates the initramfs and removes what must not stay in a golden
image (machine-id, SSH host keys, Packer's key)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .. import resources
from ..compose.params import Overrides
from ..definitions import destination
from ..definitions.load import Image, Tree
from ..engine.dockerfile import APPLY_DIR, write_context
from ..errors import BuildFailed, EnvironmentProblem, UsageError
from ..node import assemble, outputs
from ..plan import BuildPlan, LayerStep
from ..progress import Progress

COMMAND = "export packer"
KEY = "packer_ed25519"
# what the export writes into its directory (and replaces); anything else there (Packer's output
# directory, its logs) is carried into a new export, never deleted
OWNED = frozenset({"base", "layers", "template.json", KEY, f"{KEY}.pub"})
ACCESS_LAYER = "packer-access"
BOOT_LAYER = "kernel"
UPLOAD = "/tmp/nodeforge"


def packer_path() -> str:
    path = shutil.which("packer")
    if path is None:
        raise EnvironmentProblem("packer is not installed; run `make setup`")
    return path


def split_layers(image: Image) -> tuple[list[Any], list[str]]:
    """(layer refs baked into the base disk, layer names applied by Packer)."""
    refs = list(image.data["layers"])
    names = [next(iter(r)) if isinstance(r, dict) else r for r in refs]
    if BOOT_LAYER not in names:
        raise UsageError(f"images/{image.name}.yaml has no {BOOT_LAYER} layer: Packer needs a bootable base disk")
    cut = names.index(BOOT_LAYER) + 1
    return refs[:cut], names[cut:]


def base_image(tree: Tree, image: Image, public_key: str) -> str:
    """Register the base-disk image (in memory) and return its name."""
    refs, _ = split_layers(image)
    name = f"{image.name}-packer-base"
    data = {**image.data, "name": name, "summary": f"Packer base disk of {image.name}",
            "layers": [*refs, {ACCESS_LAYER: {"authorized_key": public_key}}],
            "outputs": {"tags": [f"nodeforge/{name}:{image.data['version']}"], "formats": [outputs.for_packer().name],
                        "disk-size-mib": image.data["outputs"].get("disk-size-mib")},
            "tests": []}
    layer_refs = (*image.layer_refs[:len(refs)], (ACCESS_LAYER, {"authorized_key": public_key}, None))
    tree.images[name] = dataclasses.replace(image, name=name, data=data, layer_refs=layer_refs)
    return name


def _keypair(dest: Path, previous: Path) -> str:
    """Packer's SSH key in dest: the previous export's (the base disk's step key holds the public
    key: the same key keeps it cached), else a new one."""
    key = dest / KEY
    old = [previous / KEY, previous / f"{KEY}.pub"]
    if (previous / destination.marker_name(COMMAND)).is_file() and all(p.is_file() and not p.is_symlink() for p in old):
        for p in old:
            shutil.copy2(p, dest / p.name)
    else:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nodeforge-packer", "-f", str(key)],
                       check=True, capture_output=True)
    return (dest / f"{KEY}.pub").read_text().strip()


def _layer_provisioners(step: LayerStep, index: int) -> list[dict[str, Any]]:
    where = f"{UPLOAD}/{index:02d}-{step.layer}"
    fix = [f"chmod {f.mode} {shlex.quote(f.path)} && chown {shlex.quote(f.owner + ':' + f.group)} {shlex.quote(f.path)}"
           for f in step.files]
    inline = ["set -eu", f"echo 'nodeforge: applying layer {step.layer} ({step.key[:12]})'",
              f"cp -a {where}/root/. /", *fix]
    if step.packages or step.install:  # the layer's package phase, then its config phase
        inline.append(f"bash {APPLY_DIR}/{step.layer}.install.sh")
    if step.apply:
        inline.append(f"bash {APPLY_DIR}/{step.layer}.sh")
    inline.append(f"echo 'nodeforge: applied layer {step.layer}'")
    return [{"type": "file", "source": f"layers/{index:02d}-{step.layer}/", "destination": where},
            {"type": "shell", "inline": inline, "environment_vars": ["DEBIAN_FRONTEND=noninteractive"]}]




def template(plan: BuildPlan, steps: list[tuple[int, LayerStep]], base_sha256: str) -> dict[str, Any]:
    base = outputs.for_packer()
    (base_file,) = base.files.values()
    provisioners: list[dict[str, Any]] = [
        {"type": "shell", "inline": [f"mkdir -p {' '.join(f'{UPLOAD}/{i:02d}-{s.layer}' for i, s in steps)}"
                                     if steps else "true"]}]
    for i, s in steps:
        provisioners += _layer_provisioners(s, i)
    finish = [f"upload={shlex.quote(UPLOAD)}", *resources.text("packer-finish.sh").strip().splitlines()]
    provisioners.append({"type": "shell", "inline": finish})
    return {
        "description": f"nodeforge {plan.image} {plan.version}: {plan.summary} (plan key {plan.key[:12]}). "
                       "Generated by `nodeforge export packer`; layers are applied as provisioners.",
        "variables": {
            "base_disk": f"base/{base_file}",
            "base_sha256": base_sha256,
            "ssh_private_key_file": "packer_ed25519",
            "accelerator": "tcg",
            "output_directory": f"output-{plan.image}",
            "memory": "1024",
        },
        "builders": [{
            "type": "qemu",
            "vm_name": f"{plan.image}.{base.drive}",
            "iso_url": "{{user `base_disk`}}",
            "iso_checksum": "sha256:{{user `base_sha256`}}",
            "disk_image": True,
            "format": base.drive,
            "skip_compaction": True,
            "accelerator": "{{user `accelerator`}}",
            "memory": "{{user `memory`}}",
            "cpus": 2,
            "disk_interface": "virtio",
            "net_device": "virtio-net",
            "headless": True,
            "communicator": "ssh",
            "ssh_username": "root",
            "ssh_private_key_file": "{{user `ssh_private_key_file`}}",
            "ssh_timeout": "20m",
            "shutdown_command": "systemctl poweroff",
            "shutdown_timeout": "5m",
            "output_directory": "{{user `output_directory`}}",
            "qemuargs": [["-serial", "file:serial.log"]],
        }],
        "provisioners": provisioners,
    }


def validate(template_path: Path) -> None:
    import packerpy

    packer = packerpy.PackerExecutable(executable_path=packer_path())
    rc, out, err = packer.validate(template_path.name, **{})
    if rc != 0:
        text = (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")
        raise BuildFailed(f"packer validate rejected {template_path}: {text.strip()[-800:]}")


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def export(tree: Tree, image_ref: str, config: str | None, sets: Overrides, dest: Path,
           progress: Progress | None = None) -> Path:
    """Write the Packer export of a node image to dest (builder.definitions.destination: a new or
    empty directory, or this command's export of the same image; never the project tree), through a
    temporary directory beside it renamed into place once the template validates."""
    progress = progress or Progress()
    image = tree.image(image_ref)
    if image.data["kind"] != "node":
        raise UsageError(f"{image.name} is a container image; export packer makes node builds (kind: node)")
    if ACCESS_LAYER not in tree.layers:
        raise UsageError(f"the tree has no layers/{ACCESS_LAYER}; Packer's base disk needs it for SSH")
    dest, subject = dest.absolute(), f"image {image.name}"
    destination.check(dest, tree.root, COMMAND, subject)  # before the build, not only after it
    packer_path()
    with destination.replacing(dest, tree.root, COMMAND, subject, keep=lambda name: name not in OWNED) as tmp:
        base, steps = _write(tree, image, config, sets, tmp, dest, progress)
    path = dest / "template.json"
    progress.say(image.name, f"packer template {path} (validated); base disk from {base}, "
                 f"{len(steps)} layers as provisioners: {', '.join(s.layer for _, s in steps) or 'none'}")
    return path


def _write(tree: Tree, image: Image, config: str | None, sets: Overrides, out: Path,
           previous: Path, progress: Progress) -> tuple[str, list[tuple[int, LayerStep]]]:
    """The export written into the new directory `out` (and validated there): (base image, steps)."""
    from ..pipeline import Builder

    public_key = _keypair(out, previous)
    base = base_image(tree, image, public_key)
    builder = Builder(tree, config, sets, progress)
    plan = builder.plan(image.name)
    _, applied = split_layers(image)
    result = builder.build([base])[-1]
    assert result.node is not None
    (out / "base").mkdir()
    ((role, base_file),) = outputs.for_packer().files.items()
    _link_or_copy(result.node.path(role), out / "base" / base_file)
    steps = [(i, s) for i, s in enumerate(plan.steps, start=1) if s.layer in applied]
    for i, s in steps:
        write_context(s, out / "layers" / f"{i:02d}-{s.layer}", whole=True)
    sha = result.node.sha256.get(base_file) or assemble.sha256_file(out / "base" / base_file)
    path = out / "template.json"
    path.write_text(json.dumps(template(plan, steps, sha), indent=2) + "\n")
    cwd = Path.cwd()
    try:
        os.chdir(out)
        validate(path)
    finally:
        os.chdir(cwd)
    return base, steps
