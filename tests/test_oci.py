"""Normalised OCI images: layers and config rewritten so that two clean builds give one digest;
the layout passes skopeo and travels into a registry by digest."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import docker
import pytest

from builder.export import oci
from builder.manifest import layer_tar

ROOT = Path(__file__).resolve().parent.parent
EPOCH = 1735689600
LATER = EPOCH + 86400 * 300


def pyc(source_mtime: int) -> bytes:
    return b"\xa7\r\r\n" + struct.pack("<II", 0, source_mtime) + struct.pack("<I", 10) + b"code"


def layer(path: Path, order: list[str], when: int, owner: str) -> Path:
    files = {"etc/app.conf": b"x=1\n", "var/log/dpkg.log": f"{when}\n".encode(),
             "var/cache/ldconfig/aux-cache": os.urandom(8), "var/log/apt/history.log": os.urandom(8),
             "usr/lib/python3/dist-packages/m/__pycache__/built.cpython-311.pyc": pyc(when),
             "usr/lib/python3/dist-packages/m/__pycache__/packaged.cpython-311.pyc": pyc(EPOCH - 100),
             "etc/z-last": b"z", "etc/machine-id": os.urandom(16).hex().encode() + b"\n",
             "var/lib/dkms/m/1.0/6.1.0-28-amd64/x86_64/log/make.log": f"DKMS make {when}\n".encode()}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        d = tarfile.TarInfo("etc")
        d.type, d.mtime, d.mode = tarfile.DIRTYPE, when, 0o755
        t.addfile(d)
        for name in order:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uname, info.gname, info.uid = len(files[name]), when, owner, owner, 0
            info.pax_headers = {"atime": str(when), "ctime": str(when)}
            t.addfile(info, io.BytesIO(files[name]))
        link = tarfile.TarInfo("etc/a-hardlink")
        link.type, link.linkname, link.mtime = tarfile.LNKTYPE, "etc/z-last", when
        t.addfile(link)
    return path


NAMES = ["etc/app.conf", "var/log/dpkg.log", "var/cache/ldconfig/aux-cache", "var/log/apt/history.log",
         "usr/lib/python3/dist-packages/m/__pycache__/built.cpython-311.pyc",
         "usr/lib/python3/dist-packages/m/__pycache__/packaged.cpython-311.pyc", "etc/z-last", "etc/machine-id",
         "var/lib/dkms/m/1.0/6.1.0-28-amd64/x86_64/log/make.log"]


def test_two_layers_of_the_same_content_normalise_to_the_same_bytes(tmp_path: Path) -> None:
    a = layer_tar.normalise(layer(tmp_path / "a.tar", NAMES, LATER, "root"), tmp_path / "a.gz", EPOCH)
    b = layer_tar.normalise(layer(tmp_path / "b.tar", NAMES[::-1], LATER + 77, "builder"), tmp_path / "b.gz", EPOCH)
    assert a == b == layer_tar.normalise(layer(tmp_path / "c.tar", NAMES, LATER, "root"), None, EPOCH)  # only hashed
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    assert a.digest == "sha256:" + hashlib.sha256((tmp_path / "a.gz").read_bytes()).hexdigest()
    assert a.digest == a.diff_id  # published uncompressed: the blob is the tar
    with tarfile.open(tmp_path / "a.gz") as t:
        members = t.getmembers()
    names = [m.name for m in members]
    # a file with two names is held by the first name, whatever order the tar was written in
    assert names == ["etc", "etc/a-hardlink", "etc/app.conf", "etc/machine-id",
                     "usr/lib/python3/dist-packages/m/__pycache__/packaged.cpython-311.pyc", "etc/z-last"]
    assert members[1].isreg() and members[1].size == 1
    assert members[-1].islnk() and members[-1].linkname == "etc/a-hardlink"
    assert {m.mtime for m in members} == {EPOCH}
    assert members[3].size == 0  # each machine makes its own machine-id
    assert {(m.uname, m.gname) for m in members} == {("", "")}
    assert all(not m.pax_headers for m in members)


def test_a_packaged_pyc_stays_a_pyc_compiled_during_the_build_goes() -> None:
    name = "usr/lib/x/__pycache__/y.cpython-311.pyc"
    assert layer_tar.stale_pyc(name, pyc(LATER), EPOCH)
    assert not layer_tar.stale_pyc(name, pyc(EPOCH), EPOCH)
    hashed = b"\xa7\r\r\n" + struct.pack("<I", 1) + b"\0" * 8  # hash-based: valid whatever the times
    assert not layer_tar.stale_pyc(name, hashed, EPOCH)


def test_the_config_keeps_what_the_image_is_and_drops_when_and_where_it_was_built() -> None:
    engine_config = {
        "architecture": "amd64", "os": "linux", "created": "2026-12-03T17:15:59.1Z", "docker_version": "20.10.24",
        "container": "280a0945b905", "container_config": {"Hostname": "280a0945b905"},
        "config": {"Hostname": "280a0945b905", "Env": ["PATH=/bin"], "Cmd": ["/bin/bash"], "Image": "sha256:bb2b",
                   "Volumes": None, "User": "", "Labels": {
                       "org.opencontainers.image.base.name": "nodeforge-base-repro1-a:4c23",
                       "org.opencontainers.image.base.digest": "sha256:" + "b" * 64, "x": "1"}},
        "history": [{"created": "2026-12-03T17:15:28Z", "comment": "Imported from -"},
                    {"created": "2026-12-03T17:15:37Z",
                     "created_by": "/bin/sh -c #(nop) COPY dir:" + "c" * 64 + " in / "},
                    {"created": "2026-12-03T17:15:59Z", "empty_layer": True,
                     "created_by": "LABEL org.opencontainers.image.base.digest=sha256:" + "b" * 64
                                   + " org.opencontainers.image.base.name=nodeforge-base-repro1-a:4c23"}]}
    out = oci.normalise_config(engine_config, ["sha256:1", "sha256:2"], EPOCH)
    assert out == {
        "architecture": "amd64", "os": "linux", "created": "2025-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/bash"],
                   "Labels": {"org.opencontainers.image.base.name": "nodeforge-base:4c23", "x": "1"}},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:1", "sha256:2"]},
        "history": [{"created": "2025-01-01T00:00:00Z", "created_by": "", "comment": "Imported from -"},
                    {"created": "2025-01-01T00:00:00Z", "created_by": "/bin/sh -c #(nop) COPY dir in / "},
                    {"created": "2025-01-01T00:00:00Z", "empty_layer": True,
                     "created_by": "LABEL org.opencontainers.image.base.name=nodeforge-base:4c23"}]}
    with pytest.raises(Exception, match="history names 2 layers"):
        oci.normalise_config(engine_config, ["sha256:1"], EPOCH)


# --- two isolated builds of a small container image ---------------------------------------------

SMALL = """name: oci-small
summary: a small container image for the OCI export tests
kind: container
version: "1.0"
from:
  debian: {suite: bookworm, components: [main]}
source-date-epoch: 1735689600
layers: [base, note]
outputs: {tags: ["nodeforge-test/oci-small:1.0"]}
"""


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("oci-tree")
    shutil.copytree(ROOT / "layers", t / "layers")
    (t / "images").mkdir()
    (t / "images" / "oci-small.yaml").write_text(SMALL)
    (t / "layers" / "note" / "files").mkdir(parents=True)
    (t / "layers" / "note" / "files" / "note.txt").write_text("note\n")
    (t / "layers" / "note" / "layer.yaml").write_text(
        "name: note\nsummary: writes one file\nfiles:\n  - {path: /etc/note.txt, source: note.txt}\n")
    return t


def isolated_build(tree: Path, side: str, tmp: Path) -> None:
    ns = f"ocitest{os.getpid()}-{side}"
    env = {**os.environ, "NODEFORGE_BUILD_DIR": str(tmp / f"build-{side}"), "NODEFORGE_CACHE_NAMESPACE": ns}
    proc = subprocess.run([sys.executable, "-m", "builder", "--root", str(tree), "build", "oci-small", "-q"],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def remove_namespace(c: docker.DockerClient, side: str) -> None:
    from builder.repro.twice import remove_namespaces

    remove_namespaces(c, [f"ocitest{os.getpid()}-{side}"])


@pytest.fixture(scope="module")
def exported(docker_client: docker.DockerClient, small_tree: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str]:
    """The small image built twice in isolation, each build exported: (layout A, B, digest A, B)."""
    tmp = tmp_path_factory.mktemp("oci-builds")
    digests = []
    for side in ("a", "b"):
        try:
            isolated_build(small_tree, side, tmp)
            image_id = docker_client.api.inspect_image("nodeforge-test/oci-small:1.0")["Id"]
            digests.append(oci.export(docker_client, "nodeforge-test/oci-small:1.0", EPOCH, tmp / f"oci-{side}",
                                      source=image_id))
        finally:
            remove_namespace(docker_client, side)
    return tmp / "oci-a", tmp / "oci-b", digests[0], digests[1]


@pytest.mark.slow
def test_two_isolated_builds_export_the_same_digest(exported: tuple[Path, Path, str, str]) -> None:
    a, b, da, db = exported
    assert da == db == oci.manifest_digest(a) == oci.manifest_digest(b)
    assert sorted(p.name for p in (a / "blobs" / "sha256").iterdir()) == \
        sorted(p.name for p in (b / "blobs" / "sha256").iterdir())


@pytest.mark.slow
def test_the_layout_is_valid_and_travels_to_a_registry_by_digest(exported: tuple[Path, Path, str, str],
                                                                 registry: str) -> None:
    a, _, digest, _ = exported
    if shutil.which("skopeo") is None:
        pytest.fail("skopeo is not installed: run `make setup`")
    inspect = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{a}"], capture_output=True, text=True,
                                        check=True).stdout)
    assert inspect["Digest"] == digest and inspect["Created"] == "2025-01-01T00:00:00Z"
    if shutil.which("umoci"):
        subprocess.run(["umoci", "stat", "--image", f"{a}:1.0"], check=True, capture_output=True)
    pushed = subprocess.run([sys.executable, "-m", "builder", "import", "oci", str(a), "--registry", registry],
                            capture_output=True, text=True, cwd=ROOT)
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == f"{registry}/nodeforge-test/oci-small@{digest}"
    req = urllib.request.Request(f"http://{registry}/v2/nodeforge-test/oci-small/manifests/{digest}",
                                 headers={"Accept": oci.MANIFEST_TYPE})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
        assert r.headers["Docker-Content-Digest"] == digest
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    with tarfile.open(a / "blobs" / "sha256" / json.loads(body)["layers"][-1]["digest"][7:]) as t:
        assert "etc/note.txt" in t.getnames()


# --- a layout from layer tars, without an engine ------------------------------------------------

def engine_config(layers: int) -> dict[str, object]:
    return {"architecture": "amd64", "os": "linux", "created": "2026-12-03T17:15:59Z",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
            "history": [{"created": "2026-12-03T17:15:59Z", "created_by": f"step {i}"} for i in range(layers)]}


def layout_of(tmp: Path, side: str, stamp: bytes) -> tuple[Path, str]:
    first = layer(tmp / f"{side}-1.tar", NAMES, LATER, "root")
    second = tmp / f"{side}-2.tar"
    with tarfile.open(second, "w") as t:
        info = tarfile.TarInfo("etc/build-time")
        info.size, info.mtime = len(stamp), LATER
        t.addfile(info, io.BytesIO(stamp))
    digest = oci.write_layout(engine_config(2), [first, second], "example/app:1.0", EPOCH, tmp / f"oci-{side}")
    return tmp / f"oci-{side}", digest


def test_a_layout_passes_skopeo_and_a_differing_layer_is_named(tmp_path: Path) -> None:
    from builder.repro import compare

    a, da = layout_of(tmp_path, "a", b"17:00:00\n")
    same, dsame = layout_of(tmp_path, "same", b"17:00:00\n")
    b, db = layout_of(tmp_path, "b", b"17:00:09\n")
    assert da == dsame != db
    assert compare.compare_layouts(a, same, diffoscope=False) == []
    lines = compare.compare_layouts(a, b, diffoscope=False)
    assert lines[0] == "layer 2 (step 1) differs:" and lines[1].strip() == "differs: etc/build-time"
    assert oci.layout_repository(a) == "example/app"
    if shutil.which("skopeo"):
        out = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{a}:1.0"], capture_output=True, text=True,
                                        check=True).stdout)
        assert out["Digest"] == da and len(out["Layers"]) == 2
