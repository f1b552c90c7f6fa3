"""Air-gapped builds without an engine: the mirror's index and its check, the flat repository's
files, what an offline build checks against the lock and the mirror, and the argument errors."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder import lockfile
from builder.cli import main
from builder.compose.image import compose
from builder.definitions.load import load_tree
from builder.errors import EnvironmentProblem, UsageError
from builder.mirror import index as mirror_index
from builder.mirror import repo
from builder.mirror.gather import _record_debs, base_packages
from builder.mirror.offline import prepare
from builder.progress import Progress

ROOT = Path(__file__).resolve().parent.parent.parent


def _mirror(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "mirror"
    idx = mirror_index.Index()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        idx.add_file(root, rel)
    idx.write(root)
    return root


def test_the_index_lists_every_file_with_its_sha256_and_size(tmp_path: Path) -> None:
    root = _mirror(tmp_path, {"debs/a_1_all.deb": b"a", "bases/k.tar": b"base"})
    data = json.loads((root / mirror_index.INDEX).read_text())
    assert data["format"] == mirror_index.FORMAT
    assert data["files"]["debs/a_1_all.deb"] == {"sha256": hashlib.sha256(b"a").hexdigest(), "size": 1}
    assert set(mirror_index.check(root).files) == {"debs/a_1_all.deb", "bases/k.tar"}


@pytest.mark.parametrize("change, message", [
    (lambda r: (r / "debs/a_1_all.deb").write_bytes(b"b"), "debs/a_1_all.deb: sha256 differs from the index"),
    (lambda r: (r / "debs/a_1_all.deb").write_bytes(b"aa"), "debs/a_1_all.deb: sha256 differs from the index"),
    (lambda r: (r / "debs/a_1_all.deb").unlink(), "debs/a_1_all.deb: missing"),
    (lambda r: (r / "debs/evil_1_all.deb").write_bytes(b"x"), "debs/evil_1_all.deb: not in the index"),
    (lambda r: (r / mirror_index.INDEX).write_text("{}"), "is not a nodeforge mirror index"),
    (lambda r: (r / mirror_index.INDEX).unlink(), "no readable index"),
])
def test_the_index_check_names_what_differs(tmp_path: Path, change: object, message: str) -> None:
    root = _mirror(tmp_path, {"debs/a_1_all.deb": b"a"})
    change(root)  # type: ignore[operator]
    with pytest.raises(UsageError, match="nodeforge mirror") as e:
        mirror_index.check(root)
    assert message in str(e.value)


def test_a_missing_mirror_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such directory"):
        mirror_index.check(tmp_path / "nowhere")


def test_the_flat_repository_release_has_the_hashes_of_its_indexes(tmp_path: Path) -> None:
    names = repo.write(tmp_path, [repo.stanza("Package: b\nVersion: 1", "debs/b_1_all.deb", 3, "ff"),
                                  repo.stanza("Package: a\nVersion: 2", "debs/a_2_all.deb", 4, "ee")])
    assert names == ["Packages", "Packages.gz", "Release"]
    packages = (tmp_path / "Packages").read_bytes()
    assert gzip.decompress((tmp_path / "Packages.gz").read_bytes()) == packages
    assert packages.decode().index("Package: a") < packages.decode().index("Package: b")
    assert "Filename: debs/a_2_all.deb\nSize: 4\nSHA256: ee" in packages.decode()
    release = (tmp_path / "Release").read_text()
    for name in ("Packages", "Packages.gz"):
        data = (tmp_path / name).read_bytes()
        assert f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}\n" in release
    assert repo.fields("Package: a\nDescription: x\n more\nVersion: 2") == {"Package": "a", "Description": "x",
                                                                             "Version": "2"}


def _covering_mirror(tmp_path: Path, image: str, leave_out: str = "") -> Path:
    """A mirror whose index says it holds every locked package of the image (but one)."""
    tree = load_tree(ROOT)
    plan = compose(tree, image, None, [])
    lock = lockfile.read(ROOT, image)
    assert lock is not None
    root = _mirror(tmp_path, {f"bases/{plan.base.key}.tar": b"base"})
    idx = mirror_index.read(root)
    idx.bases[plan.base.key] = f"bases/{plan.base.key}.tar"
    idx.images[image] = {"lock_sha256": hashlib.sha256(lockfile.path_for(ROOT, image).read_bytes()).hexdigest(),
                         "base": plan.base.key}
    for entry in lock.layers.values():
        for part in entry.values():
            for name, version in part.items():
                if name != leave_out:
                    idx.packages.setdefault(name, {})[version] = {"in_base": plan.base.key}
    idx.write(root)
    return root


def test_an_offline_build_is_covered_by_a_mirror_of_its_lock(tmp_path: Path) -> None:
    tree = load_tree(ROOT)
    root = _covering_mirror(tmp_path, "node-minimal")
    assert prepare(ROOT, [compose(tree, "node-minimal", None, [])], root, Progress(quiet=True)).bases


def test_a_package_missing_from_the_mirror_is_named_with_its_layer(tmp_path: Path) -> None:
    tree = load_tree(ROOT)
    root = _covering_mirror(tmp_path, "node-minimal", leave_out="prometheus-node-exporter")
    with pytest.raises(UsageError) as e:
        prepare(ROOT, [compose(tree, "node-minimal", None, [])], root, Progress(quiet=True))
    assert "package prometheus-node-exporter=" in str(e.value) and "of layer monitoring" in str(e.value)
    assert "nodeforge mirror node-minimal DIR" in str(e.value)


def test_an_unlocked_package_is_named_with_its_layer(tmp_path: Path) -> None:
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tmp_path / "tree" / d)
    layer = tmp_path / "tree" / "layers" / "monitoring" / "layer.yaml"
    layer.write_text(layer.read_text().replace("apt: [prometheus-node-exporter]",
                                               "apt: [prometheus-node-exporter, jq]"))
    tree = load_tree(tmp_path / "tree")
    root = _covering_mirror(tmp_path, "node-minimal")
    with pytest.raises(UsageError) as e:
        prepare(tree.root, [compose(tree, "node-minimal", None, [])], root, Progress(quiet=True))
    assert "package jq of layer monitoring is not in images/node-minimal.lock" in str(e.value)
    assert "nodeforge lock node-minimal" in str(e.value)


def test_a_mirror_without_the_base_is_refused(tmp_path: Path) -> None:
    tree = load_tree(ROOT)
    root = _mirror(tmp_path, {"x": b"x"})
    with pytest.raises(UsageError, match="the mirror has no base"):
        prepare(ROOT, [compose(tree, "node-minimal", None, [])], root, Progress(quiet=True))


@pytest.mark.parametrize("argv, message", [
    (["build", "--offline", "node-minimal"], "--offline needs --mirror DIR"),
    (["build", "--mirror", "x", "node-minimal"], "--mirror DIR is for offline builds"),
    (["mirror", "node-minimal"], "give one or more images and then the directory"),
    (["mirror", "no-such-image", "out"], "no such image"),
])
def test_argument_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(ROOT), *argv]) == 2
    assert message in capsys.readouterr().err


def test_mirror_of_an_image_without_a_lock_says_to_lock_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for d in ("layers", "images", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / "images" / "node-minimal.lock").unlink()
    assert main(["--root", str(tmp_path), "mirror", "node-minimal", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "images/node-minimal.lock: missing" in err and "nodeforge lock node-minimal" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_mirror_refuses_a_directory_it_did_not_make(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    assert main(["--root", str(ROOT), "mirror", "node-minimal", str(tmp_path / "out")]) == 2
    assert "is not a nodeforge mirror" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep").read_text() == "mine"


def test_the_offline_package_step_points_apt_at_the_mirror_for_its_run_only() -> None:
    from builder.engine.offline import MOUNT, command

    tree = load_tree(ROOT)
    plan = compose(tree, "node-minimal", None, [])
    assert plan.install is not None
    argv = command(plan.install, plan.base.epoch)
    script = argv[-1]
    assert argv[:2] == ["/bin/sh", "-c"]
    assert f"deb [trusted=yes] file:{MOUNT} ./" in script
    assert "Dir::Etc::SourceParts" in script and "Dir::Etc::SourceList" in script
    run = next(line for line in script.splitlines() if "APT_CONFIG=" in line)
    assert run.endswith(f"SOURCE_DATE_EPOCH={plan.base.epoch} /bin/bash /usr/lib/nodeforge/layers/packages.sh")
    assert script.splitlines()[-1].startswith("rm -f /tmp/nodeforge-offline-apt.conf")


def _deb(tmp: Path, name: str, version: str) -> Path:
    """A real (empty) .deb made by dpkg-deb."""
    src = tmp / f"src-{name}"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
                                            "Maintainer: t <t@example.org>\nDescription: test\n")
    out = tmp / "debs" / f"{name}_{version.replace(':', '%3a')}_all.deb"
    out.parent.mkdir(exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(src), str(out)], check=True,
                   capture_output=True)
    return out


def test_downloaded_debs_are_checked_against_the_lock_and_named_without_epoch(tmp_path: Path) -> None:
    a, b = _deb(tmp_path, "pkga", "1:2.0-1"), _deb(tmp_path, "pkgb", "3")
    sha_a = hashlib.sha256(a.read_bytes()).hexdigest()
    lock = lockfile.Lock("img", "k", {"l": {"direct": {"pkga": "1:2.0-1"}, "deps": {"pkgb": "3"}}},
                         archives={"pkga": {"version": "1:2.0-1", "sha256": sha_a}})
    idx = mirror_index.Index()
    wanted = {("pkga", "1:2.0-1"): "img/l", ("pkgb", "3"): "img/l"}
    assert _record_debs([a, b], wanted, {"img": lock}, tmp_path, idx) == 1
    assert idx.packages["pkga"]["1:2.0-1"] == {"file": "debs/pkga_2.0-1_all.deb", "sha256_from": "lock"}
    assert idx.packages["pkgb"]["3"]["sha256_from"] == "download"
    assert idx.files["debs/pkga_2.0-1_all.deb"]["sha256"] == sha_a


def test_a_deb_that_differs_from_the_lock_is_refused(tmp_path: Path) -> None:
    a = _deb(tmp_path, "pkga", "1")
    lock = lockfile.Lock("img", "k", {"l": {"direct": {"pkga": "1"}, "deps": {}}},
                         archives={"pkga": {"version": "1", "sha256": "0" * 64}})
    with pytest.raises(EnvironmentProblem, match="differs from the lock"):
        _record_debs([a], {("pkga", "1"): "img/l"}, {"img": lock}, tmp_path, mirror_index.Index())


def test_a_locked_package_that_did_not_come_is_named(tmp_path: Path) -> None:
    a = _deb(tmp_path, "pkga", "1")
    lock = lockfile.Lock("img", "k", {"l": {"direct": {"pkga": "1", "pkgc": "2"}, "deps": {}}})
    with pytest.raises(UsageError, match=r"no \.deb came for pkgc=2 \(img/l\)"):
        _record_debs([a], {("pkga", "1"): "img/l", ("pkgc", "2"): "img/l"}, {"img": lock}, tmp_path,
                     mirror_index.Index())


def test_the_packages_of_a_base_tarball_are_read_from_its_dpkg_status(tmp_path: Path) -> None:
    status = (b"Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\n"
              b"Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n")
    tar = tmp_path / "base.tar"
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("./var/lib/dpkg/status")
        info.size = len(status)
        t.addfile(info, io.BytesIO(status))
    assert base_packages(tar) == {("libc6", "2.36-9")}
