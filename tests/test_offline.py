"""Air-gapped builds, for real: `nodeforge mirror node-minimal DIR`, then `build --offline --mirror DIR`
run in a network namespace of its own (`unshare --net`: no interface but loopback; the engine is
still reached through its file socket), with a build directory, a base cache and an engine
namespace of its own so that nothing comes from earlier builds. The image holds exactly the locked
versions and nothing of the mirror. An unlocked package and a tampered .deb stop the build (exit 2)
before anything is built."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from support.engine import own_namespace, remove_namespace

from builder import lockfile
from builder.debian import parse_dpkg_status

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "node-minimal"
TAG = "nodeforge/node-minimal:0.1.0"
CUDA = "cuda-12.9-base"  # container-base, then NVIDIA's cudart wheel
CUDA_TAGS = ("nodeforge/container-base:bookworm", "nodeforge/cuda:12.9.1-base-debian12")

pytestmark = [pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0,
                                 reason="unshare --net is not permitted here (it needs root)")]


def nodeforge(*argv: str, env: dict[str, str] | None = None, root: Path = ROOT, net: bool = True,
              timeout: int = 3000) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "builder", "--root", str(root), *argv]
    if not net:
        cmd = ["unshare", "--net", "--", *cmd]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env or dict(os.environ))


@pytest.fixture(scope="module")
def mirror(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("offline") / "mirror"
    done = nodeforge("mirror", IMAGE, str(dest))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (dest / "nodeforge-mirror.json").is_file() and (dest / "Release").is_file()
    return dest


@pytest.fixture
def isolated(tmp_path: Path, docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """An environment sharing nothing with earlier builds; the output tags put back afterwards."""
    with own_namespace(docker_client, tmp_path, f"offline{os.getpid()}", (TAG, *CUDA_TAGS),
                       NODEFORGE_CACHE=str(tmp_path / "cache")) as env:
        yield env


def test_the_network_namespace_has_no_network() -> None:
    probe = ("import socket; print(sorted(n for _, n in socket.if_nameindex()))\n"
             "try:\n    socket.create_connection(('151.101.2.132', 80), timeout=10)\nexcept OSError as e:\n"
             "    print('unreachable', e)")
    done = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "['lo']" and "unreachable" in done.stdout


def test_offline_build_with_the_network_cut(mirror: Path, isolated: dict[str, str],
                                            docker_client: docker.DockerClient) -> None:
    done = nodeforge("build", "--offline", "--mirror", str(mirror), "-c", "default", "--format", "raw", IMAGE,
                     env=isolated, net=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "match its index" in done.stderr
    assert "imported" in done.stderr  # the base came from the mirror, not from a cache
    assert (Path(isolated["NODEFORGE_BUILD_DIR"]) / "images" / IMAGE / "disk.raw").is_file()
    read = ("cat /var/lib/dpkg/status; echo @@; cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null; "
            "echo @@; ls -A /var/lib/apt/lists /tmp /mnt")
    out = docker_client.containers.run(TAG, ["-c", read], entrypoint=["/bin/sh"], user="root", remove=True,
                                       network_mode="none").decode()
    status, sources, leftovers = out.split("@@")
    installed = {f["Package"]: f["Version"] for f in parse_dpkg_status(status).values()}
    lock = lockfile.read(ROOT, IMAGE)
    assert lock is not None
    wanted = {n: v for e in lock.layers.values() for part in e.values() for n, v in part.items()}
    assert {n: installed.get(n) for n in wanted} == wanted
    assert "deb.debian.org" in sources and "nodeforge-mirror" not in sources  # the image's own sources
    assert "nodeforge" not in leftovers and ".deb" not in leftovers


@pytest.fixture(scope="module")
def cuda_mirror(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("offline-cuda") / "mirror"
    done = nodeforge("mirror", CUDA, str(dest))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list((dest / "wheels").glob("nvidia_cuda_runtime_cu12-*.whl"))) == 1
    return dest


def test_offline_cuda_image_takes_its_wheels_from_the_mirror(cuda_mirror: Path, isolated: dict[str, str],
                                                             docker_client: docker.DockerClient) -> None:
    """cuda-12.9-base unpacks NVIDIA's cudart wheel in its package phase: offline it is copied from the
    mirror (checked against the lock's sha256 as online), and the step keeps its key."""
    done = nodeforge("build", "--offline", "--mirror", str(cuda_mirror), CUDA, env=isolated, net=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = docker_client.containers.run(CUDA_TAGS[1], ["-c", "ls /usr/local/cuda/lib64; echo @@; ls -A /tmp /mnt"],
                                       entrypoint=["/bin/sh"], user="root", remove=True,
                                       network_mode="none").decode()
    libs, leftovers = out.split("@@")
    assert "libcudart.so.12" in libs
    assert leftovers.split() == ["/mnt:", "/tmp:"]  # no wheel, no mirror, no apt configuration left


def test_offline_wheel_must_match_the_lock(cuda_mirror: Path, isolated: dict[str, str], tmp_path: Path) -> None:
    """A wheel swapped in the mirror, with an index that agrees, still fails: the mirror's files are
    checked against the lock's sha256 before the build (and the package phase checks each wheel again)."""
    dest = tmp_path / "mirror"
    shutil.copytree(cuda_mirror, dest, copy_function=os.link)  # the fixture's mirror stays intact
    (wheel,) = (dest / "wheels").glob("nvidia_cuda_runtime_cu12-*.whl")
    data = bytearray(wheel.read_bytes())
    data[-100] ^= 0xFF
    wheel.unlink()
    wheel.write_bytes(bytes(data))
    index = json.loads((dest / "nodeforge-mirror.json").read_text())
    rel = str(wheel.relative_to(dest))
    forged = hashlib.sha256(bytes(data)).hexdigest()
    index["files"][rel]["sha256"] = forged
    for versions in index["wheels"].values():  # the index agrees with the swapped file everywhere
        for entry in versions.values():
            if entry["file"] == rel:
                entry["sha256"] = forged
    (dest / "nodeforge-mirror.json").unlink()  # a hard link to the fixture's index: write a file of its own
    (dest / "nodeforge-mirror.json").write_text(json.dumps(index))
    done = nodeforge("build", "--offline", "--mirror", str(dest), CUDA, env=isolated, net=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"has sha256 {forged}, the lock says" in done.stderr, done.stderr[-3000:]
    assert "layer 1/" not in done.stderr  # refused before anything was built (the package step checks again)


def _add_package(tree: Path, layer: str, package: str) -> None:
    path = tree / "layers" / layer / "layer.yaml"
    text = path.read_text()
    assert "  apt: [prometheus-node-exporter]" in text
    path.write_text(text.replace("  apt: [prometheus-node-exporter]", f"  apt: [prometheus-node-exporter, {package}]"))


def test_an_unlocked_package_stops_the_offline_build(mirror: Path, scratch_tree: Path,
                                                     isolated: dict[str, str]) -> None:
    _add_package(scratch_tree, "monitoring", "jq")
    done = nodeforge("build", "--offline", "--mirror", str(mirror), IMAGE, root=scratch_tree, env=isolated,
                     net=False)
    assert done.returncode == 2, done.stderr
    assert "package jq of layer monitoring is not in images/node-minimal.lock" in done.stderr
    assert "nodeforge lock node-minimal" in done.stderr and "Traceback" not in done.stderr
    assert "layer 1/" not in done.stderr  # nothing was built


def test_a_tampered_deb_fails_the_index_check(mirror: Path, tmp_path: Path, isolated: dict[str, str]) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(mirror, copy, copy_function=os.link)  # hard links: the fixture's mirror stays intact
    deb = sorted((copy / "debs").glob("prometheus-node-exporter_*.deb"))[0]
    data = bytearray(deb.read_bytes())
    data[-100] ^= 0xFF
    deb.unlink()
    deb.write_bytes(bytes(data))
    done = nodeforge("build", "--offline", "--mirror", str(copy), IMAGE, env=isolated, net=False)
    assert done.returncode == 2, done.stderr
    assert f"debs/{deb.name}: sha256 differs from the index" in done.stderr
    assert "layer 1/" not in done.stderr


def test_a_base_outside_the_mirror_is_never_imported(mirror: Path, tmp_path: Path, isolated: dict[str, str],
                                                     docker_client: docker.DockerClient) -> None:
    """Issue 21 item 3: an index that names `../outside.tar` as the base (a file it does not list, so
    no check read it) is refused before the engine is used: nothing is imported or cached under the
    base's key."""
    copy = tmp_path / "copy"
    shutil.copytree(mirror, copy, copy_function=os.link)
    index = json.loads((copy / "nodeforge-mirror.json").read_text())
    ((key, rel),) = index["bases"].items()
    os.link(copy / rel, tmp_path / "outside.tar")  # a real base: imported, it would build
    index["bases"][key] = "../outside.tar"
    (copy / "nodeforge-mirror.json").unlink()  # a hard link to the fixture's index: write a file of its own
    (copy / "nodeforge-mirror.json").write_text(json.dumps(index))
    done = nodeforge("build", "--offline", "--mirror", str(copy), IMAGE, env=isolated, net=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"bases.{key}: expected a path relative to the mirror" in done.stderr and "Traceback" not in done.stderr
    assert "imported" not in done.stderr and "layer 1/" not in done.stderr
    assert docker_client.images.list(name=f"nodeforge-base-{isolated['NODEFORGE_CACHE_NAMESPACE']}") == []


def test_the_engine_imports_a_checked_base_and_caches_no_other(tmp_path: Path, docker_client: docker.DockerClient,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """import_checked against the real engine (streamed, hashed as it streams): a tarball with the
    index's sha256 is tagged under the build's key; one that differs leaves no image behind."""
    import io
    import tarfile

    from builder.engine import bootstrap
    from builder.errors import UsageError
    from builder.plan import Base

    namespace = f"importcheck{os.getpid()}"
    monkeypatch.setenv("NODEFORGE_CACHE_NAMESPACE", namespace)
    tar = tmp_path / "base.tar"
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("etc/nodeforge-test")
        info.size = 3
        t.addfile(info, io.BytesIO(b"ok\n"))
    good, bad = hashlib.sha256(tar.read_bytes()).hexdigest(), "0" * 64
    base = Base("debian", "f" * 64, {"suite": "bookworm", "variant": "minbase"}, None, 0)
    before = {i.id for i in docker_client.images.list(all=True)}
    try:
        with pytest.raises(UsageError, match="so it was not imported"):
            bootstrap.import_checked(docker_client, base, tar, bad)
        assert {i.id for i in docker_client.images.list(all=True)} == before  # imported untagged, removed
        bootstrap.import_checked(docker_client, base, tar, good)
        image = docker_client.images.get(f"nodeforge-base-{namespace}:{'f' * 64}")
        assert image.attrs["Config"]["Env"] == [f"PATH={bootstrap.PATH}"]
    finally:
        remove_namespace(namespace)
