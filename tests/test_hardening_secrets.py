"""Secrets never reach a layer or a record (issue 21, items 4, 5 and 8).

4. The package phase removes what well-known packages generate at install (SSH host keys, munge's
   key, ssl-cert's snakeoil key, a machine-id, ...) in its own layer; the root-file-system secret
   checks run on every layer of an image (a secret a later layer removes still ships in its own);
   a file a later phase removes has its blocks zeroed on the disk, not only unlinked.
5. NODEFORGE_CA_BUNDLE reaches a package step as a file the step's command reads and removes, never
   as a build argument (the legacy builder writes those into the image's history); a bundle with a
   private key is refused.
8. A git origin or mirror URL with user-info or a token query is recorded without them; a lock's
   wheel URL that carries a credential is refused.

Most tests need no engine; those that build are marked `engine`."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from support.engine import own_namespace

from builder import lockfile
from builder.checks import rootfs, secrets
from builder.compose.phases import install_script
from builder.engine import dockerfile, labels, offline, trust
from builder.errors import BuildFailed, DefinitionError, EnvironmentProblem
from builder.manifest import layer_secrets, provenance
from builder.node import disk, root_delta, root_fs
from builder.node.artifacts import NodeArtifacts
from builder.node.tree import PackagePhase
from builder.plan import LayerStep

ROOT = Path(__file__).resolve().parent.parent
EPOCH = 1735689600
PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"


def put(root: Path, rel: str, data: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data if isinstance(data, bytes) else data.encode())


def step(layer: str = "packages", install: str = "true\n", wheels: tuple[str, ...] = ()) -> LayerStep:
    return LayerStep(layer, "test step", "k" * 64, (), install, (), (), True, wheels)


# --- item 4: the package phase removes generated secrets in its own layer -----------------------

def test_the_package_phase_removes_generated_secrets_last_in_its_own_script() -> None:
    layer = LayerStep("slurm", "s", "", (), "", (), ("munge=0.5",), True, install="echo x\n")
    script = install_script([layer], node=True)
    lines = script.splitlines()
    for path in ("/etc/ssh/ssh_host_*_key", "/etc/munge/munge.key", "/etc/ssl/private/ssl-cert-snakeoil.key",
                 "/etc/ssl/certs/ssl-cert-snakeoil.pem", "/var/lib/dbus/machine-id", "/var/lib/systemd/random-seed"):
        assert any(line.startswith(f"rm -f {path} ") for line in lines), path
    assert "if [ -s /etc/machine-id ]; then : > /etc/machine-id; fi" in script  # emptied, not removed
    assert lines.index("echo x") < next(i for i, line in enumerate(lines) if "munge.key" in line) \
        < lines.index("apt-get clean")  # after every layer's own lines, in the same script


def test_the_removal_lines_run_and_remove_only_the_secrets(tmp_path: Path) -> None:
    """The lines themselves, run by bash with the image root moved to a directory of this test."""
    root = tmp_path / "root"
    for rel in ("etc/ssh/ssh_host_ed25519_key", "etc/ssh/ssh_host_ed25519_key.pub", "etc/munge/munge.key",
                "etc/ssl/private/ssl-cert-snakeoil.key", "var/lib/systemd/random-seed", "var/lib/dbus/machine-id"):
        put(root, rel, "secret\n")
    put(root, "etc/machine-id", "0123456789abcdef0123456789abcdef\n")
    put(root, "etc/ssh/sshd_config", "kept\n")
    put(root, "etc/ssl/certs/ssl-cert-snakeoil.pem", "cert\n")
    (root / "etc/ssl/certs/abcd1234.0").symlink_to("ssl-cert-snakeoil.pem")
    script = "\n".join(secrets.removal_lines()).replace(" /etc/", f" {root}/etc/").replace(" /var/", f" {root}/var/")
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True)
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == ["etc/machine-id", "etc/ssh/sshd_config"]
    assert (root / "etc/machine-id").read_text() == ""


# --- item 4: the secret checks on every layer ----------------------------------------------------

def layer_with_secrets(top: Path) -> Path:
    put(top, "etc/ssh/ssh_host_rsa_key", "k")
    put(top, "etc/munge/munge.key", os.urandom(64))
    put(top, "opt/vendor/site.pem", PEM_KEY)
    put(top, "etc/machine-id", "0123456789abcdef0123456789abcdef\n")
    put(top, "root/.netrc", "machine example.org login u password p\n")
    return top


def clean_layer(top: Path) -> Path:
    put(top, "etc/ssh/ssh_host_rsa_key.pub", "ssh-rsa AAAA")
    put(top, "etc/machine-id", "uninitialized\n")
    put(top, "etc/munge/.keep", "")
    put(top, "usr/share/doc/example/test.key", PEM_KEY)  # not where keys are kept: as the final-tree check
    os.mknod(top / "etc" / "munge" / "munge.key", 0o600 | 0o020000, 0)  # an overlay whiteout of the key
    return top


WANT = [("etc/machine-id", "rootfs/machine-id"), ("etc/munge/munge.key", "rootfs/secret-file"),
        ("etc/ssh/ssh_host_rsa_key", "rootfs/ssh-host-keys"), ("opt/vendor/site.pem", "rootfs/private-key"),
        ("root/.netrc", "rootfs/secret-file")]


def test_a_layer_directory_is_checked_for_every_kind_of_secret(tmp_path: Path) -> None:
    assert layer_secrets.scan_dir(layer_with_secrets(tmp_path / "bad")) == WANT
    if os.geteuid() == 0:
        assert layer_secrets.scan_dir(clean_layer(tmp_path / "clean")) == []


def test_a_layer_tar_is_checked_the_same_way(tmp_path: Path) -> None:
    top = layer_with_secrets(tmp_path / "bad")
    tar_path = tmp_path / "layer.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(top, arcname=".")
        wh = tarfile.TarInfo("etc/ssh/.wh.ssh_host_ecdsa_key")
        tar.addfile(wh, io.BytesIO(b""))
    assert layer_secrets.scan_tar(tar_path) == WANT


class FakeAPI:
    def __init__(self, dirs: list[Path]) -> None:  # bottom first
        self.info = {"RootFS": {"Layers": [f"sha256:{i:064x}" for i in range(1, len(dirs) + 1)]},
                     "GraphDriver": {"Name": "overlay2", "Data": {
                         "UpperDir": str(dirs[-1]), "LowerDir": ":".join(str(d) for d in reversed(dirs[:-1]))}}}

    def inspect_image(self, ref: str) -> dict[str, object]:
        return self.info


class FakeClient:
    def __init__(self, dirs: list[Path]) -> None:
        self.api = FakeAPI(dirs)


@pytest.mark.skipif(os.geteuid() != 0, reason="a whiteout is a device node: making one needs root")
def test_a_secret_hidden_by_a_later_layer_stops_the_build_naming_its_layer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    base, pkg, later = tmp_path / "l1", tmp_path / "l2", tmp_path / "l3"
    put(base, "etc/debian_version", "12\n")
    put(pkg, "etc/munge/munge.key", os.urandom(64))  # what munge's postinst makes
    clean_layer(later)  # the later layer removes it: the final tree is clean
    c = FakeClient([base, pkg, later])
    with pytest.raises(BuildFailed) as e:
        layer_secrets.check(c, "img", "slurm")  # type: ignore[arg-type]
    text = str(e.value)
    assert "layer 2 of 3" in text and "/etc/munge/munge.key [rootfs/secret-file]" in text, text
    assert "layer 1 of 3" not in text and "layer 3 of 3" not in text
    shutil.rmtree(pkg / "etc" / "munge")  # the package phase removes it in its own layer
    assert layer_secrets.check(c, "img", "slurm") == 1  # type: ignore[arg-type]  # layers 1 and 3 known clean
    assert layer_secrets.check(c, "img", "slurm") == 0  # type: ignore[arg-type]


def test_the_final_tree_refuses_a_generated_secret_or_a_credential(tmp_path: Path) -> None:
    check = next(rc for rc in rootfs.ROOTFS_CHECKS if rc.check.name == "rootfs/secret-file")
    put(tmp_path, "etc/munge/munge.key", "k")
    put(tmp_path, "home/ops/.git-credentials", "https://u:t@example.org\n")
    put(tmp_path, "etc/apt/auth.conf.d/empty.conf", "")  # empty: nothing to leak
    assert check.find(tmp_path) == ["etc/munge/munge.key", "home/ops/.git-credentials"]
    assert check.fatal


# --- item 4: a file a later phase removes leaves no bytes in the disk's free space ---------------

@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("mkfs.ext4", "debugfs", "sfdisk")):
        pytest.skip("needs root (an overlay mount) and the disk tools (make setup)")
    lower = tmp_path / "lower"
    put(lower, "etc/munge/munge.key", b"MUNGE-KEY-MARKER-7d1f" * 200)  # 4 KiB: blocks of its own
    put(lower, "etc/site/secret.conf", b"SITE-SECRET-MARKER-91ab\n")
    put(lower, "etc/kept.conf", b"KEPT-MARKER-33cc\n")
    put(lower, "etc/linked", b"LINKED-MARKER-55ee\n")
    os.link(lower / "etc/linked", lower / "etc/linked-too")  # one name removed, one kept: its data stays
    upper, work, merged = tmp_path / "upper", tmp_path / "work", tmp_path / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    p = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
                        str(merged)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"no overlay mount here: {p.stderr.strip()}")
    try:
        (merged / "etc/munge/munge.key").unlink()  # a later layer removes it
        (merged / "etc/site/secret.conf").write_bytes(b"replaced\n")  # or replaces the file
        (merged / "etc/linked").unlink()
        yield lower, merged, upper
    finally:
        subprocess.run(["umount", str(merged)], check=False)


def _disk(tmp_path: Path, lower: Path, merged: Path, upper: Path) -> bytes:
    a = NodeArtifacts("t", "k" * 64, "c" * 64, str(tmp_path), "6.1.0-0-amd64", "root=LABEL=r ro", "r",
                      root_fs.fs_uuid("p" * 64, 64, "r"), disk.ROOT_START_MIB + 64 + 1, 64)
    raw = tmp_path / "disk.raw"
    phase = PackagePhase(lower, "sha256:" + "e" * 64, [upper])
    how = root_fs.write(raw, a, merged, a.key, str(EPOCH), tmp_path / "project", phase)
    assert how.startswith("package phase made"), how
    image = f"{raw}?offset={disk.ROOT_START_MIB * disk.MIB}"
    assert subprocess.run(["e2fsck", "-fn", image], capture_output=True).returncode == 0
    assert subprocess.run(["debugfs", "-R", "cat /etc/linked-too", image], capture_output=True).stdout == \
        b"LINKED-MARKER-55ee\n"
    data = raw.read_bytes()
    raw.unlink()
    return data


def test_a_file_removed_by_a_later_phase_leaves_no_bytes_on_the_disk(
        tmp_path: Path, overlay: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    data = _disk(tmp_path, *overlay)
    assert b"MUNGE-KEY-MARKER-7d1f" not in data and b"SITE-SECRET-MARKER-91ab" not in data
    assert b"KEPT-MARKER-33cc" in data and b"LINKED-MARKER-55ee" in data
    # without the zeroing (as before the fix) the removed file's bytes stay in the free blocks
    monkeypatch.setattr(root_delta, "zero_freed", lambda *a: 0)
    shutil.rmtree(tmp_path / "project", ignore_errors=True)
    assert b"MUNGE-KEY-MARKER-7d1f" in _disk(tmp_path, *overlay)


# --- item 5: the CA bundle ----------------------------------------------------------------------

def make_ca(dest: Path) -> str:
    """A fresh test CA certificate (openssl), its PEM text."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(dest / "ca.key"),
                    "-out", str(dest / "ca.pem"), "-days", "2", "-subj", "/CN=nodeforge test CA"],
                   check=True, capture_output=True)
    return (dest / "ca.pem").read_text()


def test_a_bundle_holding_a_private_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = make_ca(tmp_path)
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(ca + (tmp_path / "ca.key").read_text())
    monkeypatch.setenv("NODEFORGE_CA_BUNDLE", str(bundle))
    with pytest.raises(EnvironmentProblem) as e:
        trust.extra_ca()
    assert e.value.exit_code == 2 and "PRIVATE KEY" in str(e.value) and str(bundle) in str(e.value)
    assert f"line {ca.count(chr(10)) + 1}" in str(e.value)
    bundle.write_text(ca)
    assert trust.extra_ca() == ca
    monkeypatch.delenv("NODEFORGE_CA_BUNDLE")  # the host's local CAs are held to the same rule
    local = tmp_path / "local"
    put(local, "site/proxy.crt", ca + PEM_KEY)
    monkeypatch.setattr(trust, "LOCAL_CAS", local)
    with pytest.raises(EnvironmentProblem, match=r"proxy\.crt, line"):
        trust.extra_ca()


def test_no_build_argument_carries_the_bundle_and_the_command_holds_none_of_it(tmp_path: Path) -> None:
    s = step(wheels=("nvidia-cuda-runtime-cu12==12.9.79",))
    assert "NODEFORGE_CA_BUNDLE" not in dockerfile.fragment(s, ".", EPOCH) and "ARG" not in dockerfile.fragment(s, ".")
    ca = make_ca(tmp_path)
    cmd = "\n".join(offline.online_command(s, EPOCH))
    assert "BEGIN CERTIFICATE" not in cmd and f"rm -f /{offline.CA_FILE}" in cmd
    assert cmd.index(f"rm -f /{offline.CA_FILE}") < cmd.index("/bin/bash")  # removed before the script runs
    with tarfile.open(fileobj=io.BytesIO(offline._context_tar(s, ca))) as tar:
        m = tar.getmember(offline.CA_FILE)
        assert m.mode == 0o600 and tar.extractfile(m).read().decode() == ca  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(offline._context_tar(s))) as tar:
        assert offline.CA_FILE not in tar.getnames()


# --- item 8: credentials in URLs ----------------------------------------------------------------

@pytest.mark.parametrize(("url", "clean", "found"), [
    ("https://oauth2:glpat-SECRET@gitlab.example.org/ops/images.git", "https://gitlab.example.org/ops/images.git",
     "user-info"),
    ("https://ghp_SECRET@github.com/ops/images.git", "https://github.com/ops/images.git", "user-info"),
    ("https://host.example/x.git?private_token=SECRET", "https://host.example/x.git",
     "a query parameter 'private_token'"),
    ("https://cdn.example/w-1.0-py3-none-any.whl?X-Amz-Signature=SECRET&X-Amz-Credential=SECRET",
     "https://cdn.example/w-1.0-py3-none-any.whl", "a query parameter 'X-Amz-Signature'"),
    ("git@github.com:ops/images.git", "github.com:ops/images.git", "user-info"),
    ("https://github.com/ops/images.git", "https://github.com/ops/images.git", ""),
    ("https://files.example/w-1.0-py3-none-any.whl#sha256=ab", "https://files.example/w-1.0-py3-none-any.whl#sha256=ab",
     ""),
])
def test_a_url_is_recorded_without_its_credentials(url: str, clean: str, found: str) -> None:
    assert lockfile.redact_url(url) == clean
    assert lockfile.url_credentials(url) == found
    assert "SECRET" not in lockfile.redact_url(url)


def test_the_git_origin_reaches_labels_manifest_and_provenance_without_credentials(tmp_path: Path) -> None:
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("x\n")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://ci:tok-SECRET@git.example.org/ops/images.git?t=SECRET"],
                   check=True)
    assert labels.git_source(tmp_path) == "https://git.example.org/ops/images.git"
    manifest = {"source": {"revision": "abc", "dirty": False,
                           "repository": "https://u:SECRET@git.example.org/ops/images.git"},
                "base": {"kind": "debian", "key": "b", "name": "debian:bookworm",
                         "debian": {"suite": "bookworm", "mirror": "https://u:SECRET@mirror.example/debian"}},
                "outputs": {}, "image": "i", "config": None, "sets": [], "plan_key": "p", "kind": "container",
                "source_date_epoch": EPOCH, "builder": {"version": "0"}}
    text = json.dumps(provenance.statement(manifest, "manifest.json", "0" * 64))
    assert "SECRET" not in text and "git+https://git.example.org/ops/images.git@abc" in text
    assert "https://mirror.example/debian" in text


def test_a_lock_whose_wheel_url_carries_a_credential_is_refused(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    lock = lockfile.Lock("img", "b", {"cuda": {"direct": {}, "deps": {}}},
                         {"cuda": {"w": {"version": "1", "sha256": "a" * 64, "direct": "true",
                                         "url": "https://u:SECRET@pypi.example/w-1-py3-none-any.whl"}}})
    with pytest.raises(DefinitionError) as e:
        lockfile.write(tmp_path, lock)
    assert not lockfile.path_for(tmp_path, "img").exists()  # nothing written
    problem = e.value.problems[0]
    assert problem.file == "images/img.lock" and problem.path == "wheels.cuda.w.url"
    assert "user-info" in problem.message and "SECRET" not in e.value.render()
    lockfile.path_for(tmp_path, "img").write_text(  # a lock edited by hand is refused when read
        "image: img\nbase: b\nlayers: {cuda: {direct: {}, deps: {}}}\nwheels:\n  cuda:\n    w: {version: '1', "
        "sha256: aa, url: 'https://pypi.example/w-1-py3-none-any.whl?token=SECRET', direct: true}\n")
    with pytest.raises(DefinitionError, match="1 problem") as e2:
        lockfile.read(tmp_path, "img")
    assert "a query parameter 'token'" in e2.value.render() and "SECRET" not in e2.value.render()


# --- against the engine --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_ref(docker_client: docker.DockerClient) -> str:
    """container-base's bootstrapped Debian base (cached by key: imported, not made, after the first time)."""
    from builder.compose.image import compose
    from builder.definitions.load import load_tree
    from builder.engine import bootstrap
    from builder.progress import Progress

    plan = compose(load_tree(ROOT), "container-base", None, [])
    return bootstrap.ensure(docker_client, plan.base, Progress(), "container-base")


def _pem_body(pem: str) -> list[str]:
    return [line for line in pem.splitlines() if len(line) > 40 and not line.startswith("-----")]


def _records(ref: str) -> str:
    """Everything the engine records about an image: its history (untruncated) and its inspection."""
    history = subprocess.run(["docker", "history", "--no-trunc", ref], capture_output=True, text=True, check=True)
    inspect = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True, check=True)
    return history.stdout + inspect.stdout


@pytest.mark.engine
@pytest.mark.parametrize("through", ["directories", "docker save"])
def test_a_secret_a_later_engine_layer_removes_is_found_in_its_layer(
        docker_client: docker.DockerClient, base_ref: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        through: str) -> None:
    monkeypatch.setenv("NODEFORGE_CACHE", str(tmp_path / "cache"))
    if through == "docker save":
        monkeypatch.setattr(layer_secrets, "layer_dirs", lambda info: None)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_ref}\nRUN mkdir -p /etc/munge && head -c 64 /dev/urandom > /etc/munge/munge.key\n"
        "RUN rm /etc/munge/munge.key\n")
    tag = f"nodeforge-test/layer-secret:{os.getpid()}"
    docker_client.images.build(path=str(tmp_path), tag=tag, rm=True, pull=False)
    try:
        n = len(docker_client.api.inspect_image(tag)["RootFS"]["Layers"])
        with pytest.raises(BuildFailed) as e:
            layer_secrets.check(docker_client, tag, "t")
        assert f"layer {n - 1} of {n}" in str(e.value), str(e.value)
        assert "/etc/munge/munge.key [rootfs/secret-file]" in str(e.value)
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.mark.engine
def test_the_package_step_reads_the_ca_bundle_and_records_no_part_of_it(
        docker_client: docker.DockerClient, base_ref: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    ca = make_ca(tmp_path)
    (tmp_path / "bundle.pem").write_text(ca)
    monkeypatch.setenv("NODEFORGE_CA_BUNDLE", str(tmp_path / "bundle.pem"))
    script = 'set -e\nprintf "%s" "$NODEFORGE_CA_BUNDLE" | sha256sum > /nodeforge-ca-seen\n'
    key = hashlib.sha256(f"ca-test {tmp_path}".encode()).hexdigest()
    s = LayerStep("packages", "CA test", key, (), script, (), (), True, ("w==1",))
    tag = offline.package_step(docker_client, s, base_ref, EPOCH, None, tmp_path / "step.log")
    try:
        look = f"cat /nodeforge-ca-seen; ls /{offline.CA_FILE} 2>&1 || true"
        seen = docker_client.containers.run(tag, ["sh", "-c", look], entrypoint=[], remove=True).decode()
        assert seen.startswith(hashlib.sha256(ca.rstrip("\n").encode()).hexdigest())  # the script had it
        assert "No such file" in seen or "cannot access" in seen  # and the image does not
        records = _records(tag)
        assert not [line for line in _pem_body(ca) if line in records]
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.fixture
def namespaced(tmp_path: Path, docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """Builds in an engine namespace of their own (every step built again; the bases' tarballs shared),
    the project's output tags put back afterwards."""
    tags = ("nodeforge/container-base:bookworm", "nodeforge/cuda:12.9.1-base-debian12")
    with own_namespace(docker_client, tmp_path, f"secrets{os.getpid()}", tags) as env:
        yield env


def _build(env: dict[str, str], *argv: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-m", "builder", "--root", str(root), "build", *argv], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=1800)


@pytest.mark.engine
@pytest.mark.slow
def test_a_wheel_image_built_with_a_ca_bundle_records_no_part_of_it(
        docker_client: docker.DockerClient, namespaced: dict[str, str], tmp_path: Path) -> None:
    """cuda-12.9-base downloads NVIDIA's cudart wheel in its package step: built with a bundle (the
    host's own CAs, which its network may need, and a test CA), none of it in history or inspect."""
    ca = make_ca(tmp_path)
    local = "".join(p.read_text() for p in sorted(trust.LOCAL_CAS.glob("**/*.crt"))) if trust.LOCAL_CAS.is_dir() else ""
    (tmp_path / "bundle.pem").write_text(local + ca)
    done = _build({**namespaced, "NODEFORGE_CA_BUNDLE": str(tmp_path / "bundle.pem")}, "cuda-12.9-base")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for ref in ("nodeforge/cuda:12.9.1-base-debian12", "nodeforge/container-base:bookworm"):
        records = _records(ref)
        assert "NODEFORGE_CA_BUNDLE=" not in records.replace('NODEFORGE_CA_BUNDLE="$ca"', "")
        assert not [line for line in _pem_body(local + ca) if line in records], ref
    layer_secrets.check(docker_client, "nodeforge/cuda:12.9.1-base-debian12", "cuda-12.9-base")


@pytest.mark.engine
@pytest.mark.slow
def test_openssh_servers_host_keys_are_in_no_layer(docker_client: docker.DockerClient, scratch_tree: Path,
                                                   namespaced: dict[str, str]) -> None:
    """openssh-server's postinst makes host keys in the package step: removed there, in no layer."""
    (scratch_tree / "layers" / "ssh-test").mkdir()
    (scratch_tree / "layers" / "ssh-test" / "layer.yaml").write_text(
        "name: ssh-test\nsummary: openssh-server, whose postinst makes host keys\napplies-to: [container]\n"
        "requires: [base]\npackages:\n  apt: [openssh-server]\n")
    base = (ROOT / "images" / "container-base.yaml").read_text()
    (scratch_tree / "images" / "ssh-test.yaml").write_text(
        re.sub(r"^  - base\b.*$", "\\g<0>\n  - ssh-test", base.replace("name: container-base", "name: ssh-test"),
               count=1, flags=re.M)
        .replace("nodeforge/container-base:bookworm", f"nodeforge-test/ssh-test:{os.getpid()}"))
    done = _build(namespaced, "ssh-test", root=scratch_tree)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ref = f"nodeforge-test/ssh-test:{os.getpid()}"
    try:
        layer_secrets.check(docker_client, ref, "ssh-test")  # raises where a layer holds a host key
        listing = docker_client.containers.run(ref, ["sh", "-c", "dpkg -s openssh-server >/dev/null && ls /etc/ssh"],
                                               entrypoint=[], remove=True).decode()
        assert "sshd_config" in listing and "ssh_host_" not in listing
    finally:
        subprocess.run(["docker", "rmi", ref], capture_output=True)
