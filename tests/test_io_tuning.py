"""io-tuning's first-boot scratch formatter on disk image files (mkfs and blkid work on plain files:
no loop devices): a blank disk gets ext4 with the configured stride and stripe width, a disk that
holds a file system or a partition table is refused and left byte-for-byte unchanged."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.compose import compose
from builder.compose.params import parse_sets

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "layers/io-tuning/files/scratch-format"
SIZE = 64 * 1024 * 1024


def blank(path: Path) -> Path:
    with open(path, "wb") as f:
        f.truncate(SIZE)
    return path


def with_ext4(path: Path, label: str = "data") -> Path:
    subprocess.run(["mkfs.ext4", "-q", "-L", label, str(blank(path))], check=True)
    return path


def with_partition_table(path: Path, kind: str) -> Path:
    subprocess.run(["sfdisk", "-q", str(blank(path))], input=f"label: {kind}\n,32M\n", text=True, check=True)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scratch_format(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def geometry(path: Path) -> dict[str, str]:
    out = subprocess.run(["dumpe2fs", "-h", str(path)], capture_output=True, text=True, check=True).stdout
    return {k.strip(): v.strip() for k, v in re.findall(r"^([A-Za-z ]+):\s*(.*)$", out, re.M)}


def test_a_blank_disk_gets_the_stride_and_stripe_width(tmp_path: Path) -> None:
    disk = blank(tmp_path / "nvme0n1.img")
    p = scratch_format("--stride", "16", "--stripe-width", "64", "--label", "scratch", disk)
    assert p.returncode == 0, p.stderr
    g = geometry(disk)
    assert (g["RAID stride"], g["RAID stripe width"], g["Block size"], g["Filesystem volume name"]) == \
        ("16", "64", "4096", "scratch")
    assert "formatted ext4 scratch (block 4096, stride 16, stripe width 64)" in p.stdout


def test_other_geometry_is_what_dumpe2fs_reads_back(tmp_path: Path) -> None:
    disk = blank(tmp_path / "md0.img")
    assert scratch_format("--stride", "32", "--stripe-width", "96", "--block-size", "2048", disk).returncode == 0
    g = geometry(disk)
    assert (g["RAID stride"], g["RAID stripe width"], g["Block size"]) == ("32", "96", "2048")


@pytest.mark.parametrize("holds", ["ext4", "gpt", "dos"])
def test_a_disk_holding_data_is_refused_and_left_unchanged(tmp_path: Path, holds: str) -> None:
    disk = tmp_path / f"{holds}.img"
    if holds == "ext4":
        with_ext4(disk)
    else:
        with_partition_table(disk, holds)
    before = digest(disk)
    p = scratch_format("--stride", "16", "--stripe-width", "64", disk)
    assert p.returncode == 1
    assert "refused: it already holds" in p.stderr
    assert ("TYPE=ext4" if holds == "ext4" else f"PTTYPE={holds}") in p.stderr
    assert digest(disk) == before


def test_one_refused_disk_does_not_stop_the_others(tmp_path: Path) -> None:
    a, used, b = blank(tmp_path / "a.img"), with_ext4(tmp_path / "used.img"), blank(tmp_path / "b.img")
    before = digest(used)
    p = scratch_format("--label", "scratch", a, used, b)
    assert p.returncode == 1 and digest(used) == before
    assert geometry(a)["Filesystem volume name"] == "scratch1" and geometry(b)["Filesystem volume name"] == "scratch3"


def test_its_own_scratch_file_system_is_kept_not_reformatted(tmp_path: Path) -> None:
    disk = blank(tmp_path / "scratch.img")
    assert scratch_format("--label", "scratch", disk).returncode == 0
    before = digest(disk)
    p = scratch_format("--label", "scratch", disk)
    assert p.returncode == 0 and "kept: already an ext4 scratch file system labelled scratch" in p.stdout
    assert digest(disk) == before


def test_an_ext4_with_another_label_is_not_taken_for_scratch(tmp_path: Path) -> None:
    disk = with_ext4(tmp_path / "home.img", label="home")
    before = digest(disk)
    assert scratch_format("--label", "scratch", disk).returncode == 1
    assert digest(disk) == before


def test_a_missing_disk_is_refused(tmp_path: Path) -> None:
    p = scratch_format("--wait", "0", tmp_path / "absent.img")
    assert p.returncode == 1 and "not a block device or disk image" in p.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--stride", "16", "--stripe-width", "60"], "not a multiple of stride 16"),
    (["--block-size", "8192"], "1024, 2048 or 4096"),
    (["--label", "a label with spaces"], "label"),
    (["--stride", "x"], "not a number"),
])
def test_bad_settings_are_usage_errors_and_touch_nothing(tmp_path: Path, args: list[str], says: str) -> None:
    disk = blank(tmp_path / "d.img")
    before = digest(disk)
    p = scratch_format(*args, disk)
    assert p.returncode == 2 and says in p.stderr
    assert digest(disk) == before


def rendered_config(*sets: str) -> str:
    from builder.definitions.load import load_tree

    plan = compose(load_tree(ROOT), "node-minimal", "v100-slurm", parse_sets(list(sets)))
    (text,) = [f.content for s in plan.steps for f in s.files if f.path == "/etc/nodeforge/scratch-disks.conf"]
    assert text is not None
    return text


def test_the_rendered_config_drives_the_script_and_the_stamp(tmp_path: Path) -> None:
    disk = blank(tmp_path / "nvme1n1.img")
    text = rendered_config("io-tuning.scratch_stride=8", "io-tuning.scratch_stripe_width=24")
    stamp = tmp_path / "state/scratch-formatted"
    text = re.sub(r'(?m)^SCRATCH_DISKS=.*$', f'SCRATCH_DISKS="{disk}"', text)
    text = re.sub(r"(?m)^SCRATCH_STAMP=.*$", f"SCRATCH_STAMP={stamp}", text)
    conf = tmp_path / "scratch-disks.conf"
    conf.write_text(text)
    p = scratch_format("--config", conf)
    assert p.returncode == 0, p.stderr
    g = geometry(disk)
    assert (g["RAID stride"], g["RAID stripe width"]) == ("8", "24") and stamp.exists()


def test_no_stamp_after_a_refusal_so_the_unit_runs_again(tmp_path: Path) -> None:
    used = with_ext4(tmp_path / "used.img")
    stamp = tmp_path / "stamp"
    assert scratch_format("--stamp", stamp, used).returncode == 1
    assert not stamp.exists()


def test_nothing_configured_is_nothing_to_do(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text(rendered_config())
    p = scratch_format("--config", conf)
    assert p.returncode == 0 and "nothing to do" in p.stdout


def test_an_unknown_config_key_is_a_usage_error(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text('SCRATCH_DISKS="/dev/null"\nRUN=rm -rf /\n')
    p = scratch_format("--config", conf)
    assert p.returncode == 2 and "unknown key RUN" in p.stderr


def test_the_unit_runs_once_and_only_until_it_has_succeeded() -> None:
    unit = (ROOT / "layers/io-tuning/files/nodeforge-scratch-format.service").read_text()
    assert "ConditionPathExists=!/var/lib/nodeforge/scratch-formatted" in unit
    assert "ExecStart=/usr/lib/nodeforge/scratch-format --config /etc/nodeforge/scratch-disks.conf" in unit
    assert "Type=oneshot" in unit


def test_geometry_helper_reads_dumpe2fs(tmp_path: Path) -> None:
    disk = with_ext4(tmp_path / "g.img")
    g: dict[str, Any] = geometry(disk)
    assert g["Filesystem volume name"] == "data" and "RAID stride" not in g


# --- IO1: the RAID geometry comes from the device unless both values are set ---------------------

def test_io1_default_gives_mkfs_no_stride_so_the_device_geometry_wins(tmp_path: Path) -> None:
    """With nothing set, mkfs.ext4 gets no -E: on an md array it reads io_min/io_opt (the real chunk);
    a plain image reports none, so no RAID geometry is written at all (64 KiB guesses were before)."""
    disk = blank(tmp_path / "md0.img")
    p = scratch_format("--label", "scratch", disk)
    assert p.returncode == 0, p.stderr
    g = geometry(disk)
    assert "RAID stride" not in g and "RAID stripe width" not in g
    assert "stride none, stripe width none from the device" in p.stdout


def test_io1_rendered_defaults_format_without_stride(tmp_path: Path) -> None:
    text = rendered_config()
    assert "SCRATCH_STRIDE=0\n" in text and "SCRATCH_STRIPE_WIDTH=0\n" in text
    disk = blank(tmp_path / "md0.img")
    conf = tmp_path / "scratch-disks.conf"
    conf.write_text(re.sub(r'(?m)^SCRATCH_DISKS=.*$', f'SCRATCH_DISKS="{disk}"', text).replace(
        "SCRATCH_STAMP=/var/lib/nodeforge/scratch-formatted", f"SCRATCH_STAMP={tmp_path / 'stamp'}"))
    p = scratch_format("--config", conf)
    assert p.returncode == 0, p.stderr
    assert "RAID stride" not in geometry(disk)


@pytest.mark.parametrize("args", [["--stride", "128"], ["--stripe-width", "512"]])
def test_io1_one_value_without_the_other_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    disk = blank(tmp_path / "d.img")
    before = digest(disk)
    p = scratch_format(*args, disk)
    assert p.returncode == 2 and "set both, or neither" in p.stderr
    assert digest(disk) == before


def test_io1_one_value_without_the_other_is_a_definition_error() -> None:
    from builder.errors import DefinitionError

    with pytest.raises(DefinitionError) as err:
        rendered_config("io-tuning.scratch_stride=128")
    assert "set both, or leave both 0" in "\n".join(p.message for p in err.value.problems)
