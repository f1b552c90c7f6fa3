"""CUDA container images: base -> runtime -> devel for 11.8 (Debian), 12.9 and 13.0 (NVIDIA's wheels).

Built once per session (conftest.cuda_images); every image's own tests run here, plus what
crosses images: a program compiled in devel runs in runtime, the SBOM matches dpkg, and the
images survive a round trip through a real registry by digest."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import docker
import pytest

from builder import publish
from builder.compose import compose
from builder.definitions.load import Tree
from builder.engine import sbom
from builder.engine.client import SESSION_LABEL
from builder.pipeline import BuildResult
from builder.verify import run as verify

Images = dict[str, BuildResult]
Client = docker.DockerClient

# cudart plus one library family, beside the full runtime: (image, family, -D of the library check, -l)
PER_LIBRARY = [("cuda-13.0-runtime-cublas", "cuBLAS", "CHECK_CUBLAS", "cublas"),
               ("cuda-13.0-runtime-cufft", "cuFFT", "CHECK_CUFFT", "cufft"),
               ("cuda-13.0-runtime-nccl", "NCCL", "CHECK_NCCL", "nccl")]
CHAIN = ["cuda-11.8-base", "cuda-11.8-runtime", "cuda-11.8-devel", "cuda-12.9-base", "cuda-12.9-runtime",
         "cuda-13.0-base", "cuda-13.0-runtime", "cuda-13.0-devel", *(p[0] for p in PER_LIBRARY),
         "cuda-12.9-cudnn-runtime", "cuda-13.0-cudnn-runtime", "cuda-13.0-cudnn-devel", "cuda-13.0-base-distroless",
         # Debian 13: the same definitions on container-base-trixie (tags say the release)
         "container-base-trixie", "cuda-12.9-base-debian13", "cuda-12.9-runtime-debian13", "cuda-13.0-base-debian13",
         "cuda-13.0-runtime-debian13", "cuda-13.0-devel-debian13", "cuda-13.0-base-distroless-debian13"]
TAGS = {"cuda-11.8-base": "nodeforge/cuda:11.8.0-base-debian12",
        "cuda-11.8-runtime": "nodeforge/cuda:11.8.0-runtime-debian12",
        "cuda-11.8-devel": "nodeforge/cuda:11.8.0-devel-debian12",
        "cuda-12.9-base": "nodeforge/cuda:12.9.1-base-debian12",
        "cuda-12.9-runtime": "nodeforge/cuda:12.9.1-runtime-debian12",
        "cuda-13.0-base": "nodeforge/cuda:13.0.2-base-debian12",
        "cuda-13.0-runtime": "nodeforge/cuda:13.0.2-runtime-debian12",
        "cuda-13.0-devel": "nodeforge/cuda:13.0.2-devel-debian12",
        "cuda-13.0-runtime-cublas": "nodeforge/cuda:13.0.2-runtime-cublas-debian12",
        "cuda-13.0-runtime-cufft": "nodeforge/cuda:13.0.2-runtime-cufft-debian12",
        "cuda-13.0-runtime-nccl": "nodeforge/cuda:13.0.2-runtime-nccl-debian12",
        "cuda-12.9-cudnn-runtime": "nodeforge/cuda:12.9.1-cudnn-runtime-debian12",
        "cuda-13.0-cudnn-runtime": "nodeforge/cuda:13.0.2-cudnn-runtime-debian12",
        "cuda-13.0-cudnn-devel": "nodeforge/cuda:13.0.2-cudnn-devel-debian12",
        "cuda-13.0-base-distroless": "nodeforge/cuda:13.0.2-base-distroless-debian12",
        "container-base-trixie": "nodeforge/container-base:trixie",
        "cuda-12.9-base-debian13": "nodeforge/cuda:12.9.1-base-debian13",
        "cuda-12.9-runtime-debian13": "nodeforge/cuda:12.9.1-runtime-debian13",
        "cuda-13.0-devel-debian13": "nodeforge/cuda:13.0.2-devel-debian13",
        "cuda-13.0-base-debian13": "nodeforge/cuda:13.0.2-base-debian13",
        "cuda-13.0-runtime-debian13": "nodeforge/cuda:13.0.2-runtime-debian13",
        "cuda-13.0-base-distroless-debian13": "nodeforge/cuda:13.0.2-base-distroless-debian13"}


@pytest.mark.parametrize("image", CHAIN)
def test_image_passes_its_tests(cuda_images: Images, tree: Tree, image: str, tmp_path: Path) -> None:
    result = cuda_images[image]
    assert result.tags == (TAGS[image],)
    assert verify.run_tests(result.plan, tmp_path, False, tree, ref=result.ref) == 0
    report = json.loads((tmp_path / f"{image}.json").read_text())
    counts = report["counts"]
    assert counts["failed"] == 0 and counts["passed"] > 0
    assert counts["passed"] + counts["skipped"] + counts["not-run"] == len(result.plan.tests)
    assert all(r["status"] == "passed" or r["message"] for r in report["results"])


def test_cupy_example_uses_the_image_cuda_libraries(cuda_images: Images, tree: Tree, tmp_path: Path) -> None:
    result = cuda_images["cupy-cuda12.9"]
    assert result.plan.base.image == "cuda-12.9-runtime"
    assert verify.run_tests(result.plan, tmp_path, False, tree, ref=result.ref) == 0
    status = {r["name"]: r["status"] for r in json.loads((tmp_path / "cupy-cuda12.9.json").read_text())["results"]}
    assert status["CuPy loads cuBLAS from the image's /usr/local/cuda, not a copy of its own"] == "passed"
    assert status["CuPy imports and reports the image's CUDA runtime"] == "passed"


def test_slim_layer_passes_its_tests_on_the_slim_base(cuda_images: Images, tree: Tree, tmp_path: Path) -> None:
    slim = cuda_images["cuda-11.8-base-slim"]
    assert verify.run_tests(slim.plan, tmp_path, False, tree, ref=slim.ref) == 0


def _sh(client: Client, ref: str, script: str) -> tuple[int, str]:
    c = client.containers.run(ref, ["sh", "-c", script], entrypoint=[], detach=True)
    try:
        rc = c.wait()["StatusCode"]
        return rc, c.logs().decode()
    finally:
        c.remove(force=True)


@pytest.mark.parametrize("name", ["container-base", "container-base-trixie"])
def test_container_base_is_slim_and_keeps_apt(cuda_images: Images, docker_client: Client, name: str) -> None:
    base = cuda_images[name]
    assert base.plan.base.debian is not None and base.plan.base.debian["slim"] is True
    # no perl beyond perl-base (usrmerge, which needs it, is not there: mmdebstrap's hook merged /usr)
    for pkg in ("perl", "usrmerge", "perl-modules-5.36", "perl-modules-5.40"):
        assert _sh(docker_client, base.ref, f"dpkg -s {pkg}")[0] != 0, pkg
    assert _sh(docker_client, base.ref, "dpkg -s apt usr-is-merged perl-base")[0] == 0
    assert _sh(docker_client, base.ref, "[ -L /bin ] && [ -L /lib ]")[0] == 0  # merged /usr
    # documentation but the copyright files, man pages, translations, logs and -old backups: none
    rc, out = _sh(docker_client, base.ref, "find /usr/share/doc -type f ! -name copyright; "
                  "find /usr/share/man /usr/share/info /usr/share/lintian -type f ! -path /usr/share/info/dir "
                  "2>/dev/null; "
                  "find /usr/share/locale -type f ! -name locale.alias 2>/dev/null; "
                  "ls /var/log/dpkg.log /var/log/apt/* /var/lib/dpkg/*-old /var/cache/debconf/*-old 2>/dev/null; "
                  "ls /var/lib/apt/lists/ | grep -v '^partial$' | grep -v '^lock$'; true")
    assert rc == 0 and out == "", out
    rc, out = _sh(docker_client, base.ref, "find /usr/share/doc -name copyright | wc -l")
    assert int(out) > 20  # the licences ship with the binaries
    # the rules are in the base's dpkg configuration, so every later install follows them
    rc, out = _sh(docker_client, base.ref, "cat /etc/dpkg/dpkg.cfg.d/99mmdebstrap")
    assert "path-exclude=/usr/share/doc/*" in out and "path-include=/usr/share/doc/*/copyright" in out


def test_packages_installed_with_apt_on_the_slim_base_work(cuda_images: Images, docker_client: Client) -> None:
    # cuda-11.8-base installs libcudart11.0 with apt on top of container-base, cuda-11.8-devel a
    # compiler and the toolkit, cupy-cuda12.9 python3: they work and follow the base's dpkg rules (a
    # package's symbolic links in /usr/share/doc stay: dpkg excludes files, not the links to them)
    base = cuda_images["cuda-11.8-base"]
    assert _sh(docker_client, base.ref, "ls /usr/share/doc/libcudart11.0/") == (0, "copyright\n")
    rc, out = _sh(docker_client, cuda_images["cupy-cuda12.9"].ref,
                  "python3 -c 'import json, ssl; print(json.dumps(ssl.OPENSSL_VERSION[:7]))' && "
                  "find /usr/share/doc/python3.11/ -type f -printf '%f\\n' && "
                  "ls /usr/share/man/man1 2>/dev/null | wc -l")
    assert rc == 0 and out.split() == ['"OpenSSL"', "copyright", "0"], out
    rc, out = _sh(docker_client, cuda_images["cuda-11.8-devel"].ref,
                  "printf 'int main(){return 0;}' > /tmp/a.c && g++-11 -x c++ -o /tmp/a /tmp/a.c && /tmp/a && echo ok")
    assert (rc, out.strip()) == (0, "ok"), out


def test_non_root_default_user(cuda_images: Images, docker_client: Client) -> None:
    cupy = cuda_images["cupy-cuda12.9"]
    assert docker_client.images.get(cupy.ref).attrs["Config"]["User"] == "app"
    out = docker_client.containers.run(cupy.ref, ["id", "-u"], remove=True).decode().strip()
    assert out == "1000"
    parent = cuda_images["cuda-12.9-runtime"]
    assert docker_client.images.get(parent.ref).attrs["Config"]["User"] in ("", "root")


def test_chain_builds_from_each_other(cuda_images: Images) -> None:
    for child, parent in (("cuda-11.8-runtime", "cuda-11.8-base"), ("cuda-11.8-devel", "cuda-11.8-runtime"),
                          ("cuda-12.9-runtime", "cuda-12.9-base"), ("cuda-13.0-devel", "cuda-13.0-runtime"),
                          ("cuda-13.0-cudnn-runtime", "cuda-13.0-runtime"),
                          ("cuda-13.0-cudnn-devel", "cuda-13.0-cudnn-runtime"),
                          ("cuda-13.0-base-debian13", "container-base-trixie"),
                          ("cuda-13.0-devel-debian13", "cuda-13.0-runtime-debian13")):
        labels = cuda_images[child].labels
        assert labels["org.opencontainers.image.base.name"] == TAGS[parent]
        assert labels["org.opencontainers.image.base.digest"] == cuda_images[parent].id
    base_of = {cuda_images[n].labels["org.opencontainers.image.base.name"] for n in ("cuda-11.8-base",
                                                                                        "cuda-12.9-base")}
    assert base_of == {"nodeforge/container-base:bookworm"}  # one bootstrapped base, shared


def _compile(c: docker.DockerClient, devel: str, source_flags: str, program: str = "cuda-check",
             libraries: str = "") -> bytes:
    box = c.containers.create(devel, ["-c", f"cd /tmp && nvcc {source_flags} -cudart shared -o {program} "
                                      f"/usr/local/share/nodeforge/{program}.cu {libraries}"], entrypoint=["/bin/sh"],
                              labels={SESSION_LABEL: "cuda-compile"})
    try:
        box.start()
        assert box.wait(timeout=600)["StatusCode"] == 0, box.logs().decode(errors="replace")
        stream, _ = box.get_archive(f"/tmp/{program}")
        return b"".join(stream)
    finally:
        box.remove(force=True)


def _run_program(c: docker.DockerClient, image: str, archive: bytes, program: str) -> tuple[int, str, str]:
    box = c.containers.create(image, [f"/tmp/{program}"], labels={SESSION_LABEL: "cuda-run"})
    try:
        box.put_archive("/tmp", archive)
        box.start()
        code = box.wait(timeout=120)["StatusCode"]
        out = box.logs(stdout=True, stderr=False).decode(errors="replace")
        err = box.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        box.remove(force=True)
    return code, out, err


@pytest.mark.parametrize("devel,runtime,flags", [("cuda-11.8-devel", "cuda-11.8-runtime", "-ccbin g++-11"),
                                                 ("cuda-13.0-devel", "cuda-13.0-runtime", ""),
                                                 ("cuda-13.0-devel-debian13", "cuda-13.0-runtime-debian13", "")])
def test_runtime_runs_the_program_devel_compiled(cuda_images: Images, docker_client: Client, devel: str, runtime: str,
                                                 flags: str) -> None:
    archive = _compile(docker_client, cuda_images[devel].ref, flags)
    code, out, err = _run_program(docker_client, cuda_images[runtime].ref, archive, "cuda-check")
    # no GPU here: the runtime loads and reports why there is no device, by its number
    assert code in (100, 35), out + err
    assert f"({code})" in out and ("cudaErrorNoDevice" in out or "cudaErrorInsufficientDriver" in out)
    assert "The NVIDIA Driver was not detected" in err  # through the image's own entrypoint


@pytest.mark.parametrize("image,family,define,library", PER_LIBRARY)
def test_per_library_runtime_runs_the_library_check_devel_compiled(cuda_images: Images, docker_client: Client,
                                                                   image: str, family: str, define: str,
                                                                   library: str) -> None:
    archive = _compile(docker_client, cuda_images["cuda-13.0-devel"].ref, f"-D{define}", "cuda-library-check",
                       f"-l{library}")
    code, out, err = _run_program(docker_client, cuda_images[image].ref, archive, "cuda-library-check")
    # the library loads and answers (its version needs no device), then cudart reports why there is no GPU
    full = cuda_images["cuda-13.0-runtime"].plan.packages
    version = full[f"pip:nvidia-{library}-cu13" if library == "nccl" else f"pip:nvidia-{library}"].value
    assert re.search(rf"^{family} {re.escape('.'.join(version.split('.')[:3]))}$", out, re.M), (version, out)
    assert code in (100, 35) and f"({code})" in out, out + err
    assert "The NVIDIA Driver was not detected" in err


def test_cudnn_runtime_runs_the_check_cudnn_devel_compiled(cuda_images: Images, docker_client: Client) -> None:
    archive = _compile(docker_client, cuda_images["cuda-13.0-cudnn-devel"].ref, "", "cudnn-check", "-lcudnn")
    runtime = cuda_images["cuda-13.0-cudnn-runtime"]
    code, out, err = _run_program(docker_client, runtime.ref, archive, "cudnn-check")
    version = runtime.plan.packages["pip:nvidia-cudnn-cu13"].value  # the locked wheel is the one loaded
    assert re.search(rf"^cuDNN {re.escape('.'.join(version.split('.')[:3]))} \(built against cudart 13\.", out,
                     re.M), (version, out)
    assert code in (100, 35) and f"({code})" in out, out + err
    assert "The NVIDIA Driver was not detected" in err
    # NVIDIA's conventions: NV_CUDNN_VERSION and the label name the wheel's exact version
    config = docker_client.images.get(runtime.ref).attrs["Config"]
    assert f"NV_CUDNN_VERSION={version}" in config["Env"]
    assert config["Labels"]["com.nvidia.cudnn.version"] == version


def test_distroless_base_runs_the_check_program_as_its_entrypoint(cuda_images: Images, docker_client: Client,
                                                                 root: Path) -> None:
    distroless = cuda_images["cuda-13.0-base-distroless"]
    assert distroless.size <= 40e6, distroless.size  # the goal; NVIDIA's 12.x base: 237 MB
    config = docker_client.images.get(distroless.ref).attrs["Config"]
    assert config["User"] == "nonroot" and not config["Entrypoint"]
    # no shell to run anything with
    with pytest.raises(docker.errors.APIError, match="/bin/sh"):
        docker_client.containers.run(distroless.ref, ["/bin/sh", "-c", "true"], remove=True)
    # the program the devel image compiled, as the entrypoint, as the non-root user
    archive = _compile(docker_client, cuda_images["cuda-13.0-devel"].ref, "")
    box = docker_client.containers.create(distroless.ref, [], entrypoint=["/tmp/cuda-check"],
                                          labels={SESSION_LABEL: "cuda-run"})
    try:
        box.put_archive("/tmp", archive)
        box.start()
        code = box.wait(timeout=120)["StatusCode"]
        out = box.logs().decode(errors="replace")
    finally:
        box.remove(force=True)
    assert code in (100, 35) and f"({code})" in out and "cudart 13.0" in out, out
    # the SBOM lists what is there: the kept packages and the cudart wheel, nothing that was cut away
    doc = json.loads(sbom.path_for(root, "cuda-13.0-base-distroless").read_bytes())
    names = {p["name"] for p in doc["packages"]}
    assert {"libc6", "libstdc++6", "ca-certificates", "tzdata", "nvidia-cuda-runtime"} <= names
    assert not names & {"dpkg", "apt", "bash", "coreutils", "perl-base", "procps"}
    full = sbom.counts(json.loads(sbom.path_for(root, "cuda-13.0-base").read_bytes()))
    assert sbom.counts(doc)["deb"] < full["deb"] and sbom.counts(doc)["pypi"] == full["pypi"]


def test_per_library_runtimes_are_a_fraction_of_the_full_one(cuda_images: Images, docker_client: Client) -> None:
    full = cuda_images["cuda-13.0-runtime"]
    base = cuda_images["cuda-13.0-base"]
    sizes = {image: cuda_images[image].size for image, *_ in PER_LIBRARY}
    assert all(base.size < size < full.size for size in sizes.values()), sizes
    # cuBLAS is most of the full runtime; cuFFT and NCCL images are well under half of it
    assert sizes["cuda-13.0-runtime-cufft"] < full.size / 2 and sizes["cuda-13.0-runtime-nccl"] < full.size / 2
    # the chain's conventions are the full runtime's: env (NVIDIA_REQUIRE_CUDA too) and entrypoint
    for image, *_ in PER_LIBRARY:
        plan = cuda_images[image].plan
        assert {k: v.value for k, v in plan.env.items()} == {k: v.value for k, v in full.plan.env.items()}
        config = docker_client.images.get(cuda_images[image].ref).attrs["Config"]
        assert config["Entrypoint"] == docker_client.images.get(full.ref).attrs["Config"]["Entrypoint"]
        assert cuda_images[image].labels["org.opencontainers.image.base.name"] == TAGS["cuda-13.0-base"]


@pytest.mark.parametrize("image", ["cuda-11.8-runtime", "cuda-12.9-runtime", "cuda-13.0-devel",
                                   "cuda-12.9-cudnn-runtime"])
def test_sbom_matches_the_package_databases(cuda_images: Images, docker_client: Client, root: Path,
                                            image: str) -> None:
    result = cuda_images[image]
    path = sbom.path_for(root, image)
    data = path.read_bytes()
    assert result.labels[sbom.LABEL] == hashlib.sha256(data).hexdigest()
    doc = json.loads(data)
    assert doc["spdxVersion"] == "SPDX-2.3" and doc["documentNamespace"].endswith(result.plan.key)
    counts = sbom.counts(doc)
    listing = docker_client.containers.run(result.ref, ["-c", "dpkg -l | grep -cE '^(ii|hi) '; "
                                           "find /opt /usr/local/lib -path '*.dist-info/METADATA' | wc -l"],
                                           entrypoint=["/bin/sh"], remove=True).decode().split()
    assert counts["deb"] == int(listing[0])
    assert counts.get("pypi", 0) == int(listing[1])
    if "11.8" not in image:
        assert counts["pypi"] >= 8  # the CUDA wheels are in it


def test_registry_round_trip_by_digest(cuda_images: Images, docker_client: Client, tree: Tree, registry: str,
                                       tmp_path: Path) -> None:
    names = ["cuda-11.8-base", "cuda-12.9-base"]
    pushed = publish.push(docker_client, [(n, cuda_images[n].tags) for n in names], registry)
    assert [p.tag for p in pushed] == [f"{registry}/{TAGS[n]}" for n in names]
    try:
        for p in pushed:
            assert p.digest.startswith("sha256:")
            assert p.tag not in docker_client.images.get(TAGS[p.image]).tags  # push leaves no registry tag
            docker_client.images.remove(TAGS[p.image])
            pulled = docker_client.images.pull(p.by_digest)
            assert pulled.id == cuda_images[p.image].id
            plan = compose(tree, p.image, None, [])
            assert verify.run_tests(plan, tmp_path, False, tree, ref=p.by_digest) == 0
    finally:
        for n in names:
            repo, tag = TAGS[n].split(":")
            docker_client.api.tag(cuda_images[n].id, repo, tag)


def test_push_needs_a_registry(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builder.cli import main

    assert main(["push", str(root / "images" / "cuda-11.8-base.yaml")]) == 2
    assert "no registry" in capsys.readouterr().err

