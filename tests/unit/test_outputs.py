"""The outputs table (builder.node.outputs) is the one place a node output format is declared:
every name in builder.plan.FORMATS has exactly one entry and every entry a name; the definitions'
enum and default are FORMATS; the boot modes, the boot drive and Packer's base disk are asked of
the table. A format added (a toy one: a tar of the root file system) is one entry and one maker:
the schema takes it, lists it, and the assembler's loop calls its maker (no engine: a tiny fake
tree in a work directory)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from builder import plan
from builder.definitions import documents
from builder.definitions.reference import document
from builder.definitions.spec import Struct
from builder.definitions.tables import FORMAT, IMAGE
from builder.errors import EnvironmentProblem, UsageError
from builder.node import assemble, outputs
from builder.node.archive import ChunkCache
from builder.node.artifacts import NodeArtifacts
from builder.node.outputs import OUTPUTS, Making, Output
from builder.verify import boot

KVER = "6.1.0-28-amd64"


def _outputs_spec() -> Struct:
    spec = IMAGE.fields["outputs"].spec
    assert isinstance(spec, Struct)
    return spec


def node(files: dict[str, str], directory: Path = Path("/nonexistent")) -> NodeArtifacts:
    return NodeArtifacts("toy-node", "k" * 64, "c" * 64, str(directory), KVER, "root=LABEL=nf-root ro", "nf-root",
                         "uuid", 600, 500, files=dict(files))


def test_every_format_has_exactly_one_entry_and_every_entry_a_format() -> None:
    assert len(plan.FORMATS) == len(set(plan.FORMATS))
    assert set(OUTPUTS) == set(plan.FORMATS)
    assert all(name == o.name for name, o in OUTPUTS.items())


def test_the_definitions_take_their_formats_and_default_from_formats() -> None:
    assert FORMAT.choices == plan.FORMATS
    assert _outputs_spec().fields["formats"].default == list(plan.FORMATS)
    assert IMAGE.fields["outputs"].default["formats"] == list(plan.FORMATS)


def test_entries_are_consistent_with_the_boot_modes_and_each_other() -> None:
    modes = [m for o in OUTPUTS.values() for m in o.boots]
    assert set(modes) == set(boot.ALL_MODES), "every boot mode boots some output, and only known modes"
    files = [f for o in OUTPUTS.values() for f in o.files.values()] + list(outputs.KERNEL.values())
    roles = [r for o in OUTPUTS.values() for r in o.files] + list(outputs.KERNEL)
    assert len(files) == len(set(files)) and len(roles) == len(set(roles))
    for o in OUTPUTS.values():
        assert o.drive is None or len(o.files) == 1, f"{o.name}: a boot drive is one file"
    (packer,) = [o for o in OUTPUTS.values() if o.packer]
    assert packer is outputs.for_packer() and packer.drive is not None and len(packer.files) == 1


def test_formats_are_made_in_the_tables_order_whatever_the_order_asked() -> None:
    assert [o.name for o in outputs.selected(["netboot", "qcow2", "raw"])] == list(plan.FORMATS)
    assert [o.name for o in outputs.selected(["qcow2"])] == ["qcow2"] and outputs.selected(None) == []


def test_a_disk_mode_boots_the_qcow2_when_there_is_one_else_the_raw_disk(tmp_path: Path) -> None:
    both = node({**outputs.KERNEL, "raw": "disk.raw", "qcow2": "disk.qcow2"}, tmp_path)
    assert boot.boot_drive(both, "bios") == (tmp_path / "disk.qcow2", "qcow2")
    raw = node({**outputs.KERNEL, "raw": "disk.raw"}, tmp_path)
    assert boot.boot_drive(raw, "uefi") == (tmp_path / "disk.raw", "raw")
    cmd = boot.qemu_command(raw, "bios", "tcg", tmp_path)
    assert f"file={tmp_path / 'disk.raw'},format=raw,if=none,id=disk,snapshot=on" in cmd


def test_a_mode_without_its_output_is_refused_with_the_formats_that_would_do() -> None:
    netboot_only = node({**outputs.KERNEL, "rootfs": "rootfs.tar.gz", "ipxe": "boot.ipxe"})
    assert boot.boot_drive(netboot_only, "netboot") is None
    with pytest.raises(EnvironmentProblem, match=r"nothing a direct boot can start; add raw or qcow2 to outputs"):
        boot.boot_drive(netboot_only, "direct")
    with pytest.raises(EnvironmentProblem, match=r"add netboot to outputs.formats"):
        boot.boot_drive(node({**outputs.KERNEL, "qcow2": "disk.qcow2"}), "netboot")


def make_tarball(m: Making) -> dict[str, str]:
    """The toy format's maker: the root file system as a plain tar."""
    with tarfile.open(m.path("tarball"), "w") as tar:
        tar.add(m.rootfs, arcname=".")
    return {}  # nothing hashed on the way: the assembler hashes it


TARBALL = Output("tarball", make_tarball, {"tarball": "rootfs.tar"})


def _fake_tree(tmp_path: Path) -> Making:
    rootfs = tmp_path / "rootfs"
    (rootfs / "boot").mkdir(parents=True)
    (rootfs / "boot" / f"vmlinuz-{KVER}").write_bytes(b"kernel")
    (rootfs / "boot" / f"initrd.img-{KVER}").write_bytes(b"initramfs")
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "hostname").write_text("toy\n")
    (tmp_path / "work").mkdir()
    art = node({}, tmp_path / "work")
    return Making(art, rootfs, tmp_path / "work", "1.0", "0", tmp_path, ChunkCache(tmp_path / "chunks"))


def test_a_format_added_is_taken_by_the_schema_listed_and_made_by_the_assemblers_loop(tmp_path: Path) -> None:
    asked = {"tags": [], "formats": ["qcow2", "tarball"]}
    with pytest.raises(UsageError) as refused:
        documents.check(asked, _outputs_spec(), "images/toy.yaml", "image", "")
    assert "formats[1]: expected one of raw, qcow2, netboot, found string 'tarball'" in refused.value.render()
    with outputs.registered(TARBALL):
        assert plan.FORMATS == ("raw", "qcow2", "netboot", "tarball") and OUTPUTS["tarball"] is TARBALL
        assert documents.check(asked, _outputs_spec(), "images/toy.yaml", "image", "")["formats"] == asked["formats"]
        assert "one of raw, qcow2, netboot, tarball" in document("image", IMAGE)
        test_every_format_has_exactly_one_entry_and_every_entry_a_format()

        m = _fake_tree(tmp_path)
        assemble.make_outputs(m, ["tarball"])
        assert m.art.files == {"kernel": "vmlinuz", "initrd": "initrd.img", "tarball": "rootfs.tar"}
        with tarfile.open(m.path("tarball")) as tar:
            assert "./etc/hostname" in tar.getnames()
        assert (m.work / "vmlinuz").read_bytes() == b"kernel"
        assert m.art.sha256 == {f: hashlib.sha256((m.work / f).read_bytes()).hexdigest()
                                for f in ("initrd.img", "rootfs.tar", "vmlinuz")}
        assert not (m.work / outputs.DISK).exists(), "no disk format asked for: no disk made"
    assert "tarball" not in OUTPUTS and plan.FORMATS == ("raw", "qcow2", "netboot")
    assert FORMAT.choices == plan.FORMATS


def test_a_format_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already in the table"), outputs.registered(OUTPUTS["raw"]):
        pass


def test_a_failing_maker_fails_the_loop(tmp_path: Path) -> None:
    def broken(m: Making) -> dict[str, str]:
        raise OSError(28, "No space left on device")

    with outputs.registered(Output("broken", broken, {"broken": "broken.img"})), \
            pytest.raises(OSError, match="No space left"):
        assemble.make_outputs(_fake_tree(tmp_path), ["broken"])
