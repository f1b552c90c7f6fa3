"""Secure Boot module signing with the build host's openssl: the kernel's signature format (checked
against `openssl cms` and kmod's modinfo), what is signed in a tree and what is left alone, the
certificate for mokutil, and every bad `--secret` exiting 2 with what to do."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from support.keys import CN, make_key, openssl

from builder.checks import rootfs
from builder.cli import main
from builder.errors import BuildFailed, UsageError
from builder.node import signing
from builder.node.signing import MAGIC, SigningKey, sign_modules, split_signature

KVER = "6.1.0-28-amd64"
FIXTURES = Path(__file__).parent / "fixtures" / "module-signing"

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="openssl is not installed on this host")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_key(tmp_path_factory.mktemp("key"))


@pytest.fixture(scope="module")
def key(keys: tuple[Path, Path, Path]) -> SigningKey:
    return SigningKey.load(keys[2])


def tiny_module(name: str) -> bytes:
    """A relocatable x86-64 ELF with a .modinfo section: enough for modinfo, like a real .ko."""
    modinfo = (f"license=GPL\0description=nodeforge test module\0name={name}\0"
               f"vermagic={KVER} SMP mod_unload modversions \0").encode()
    names = b"\0.modinfo\0.shstrtab\0"
    shoff = (64 + len(modinfo) + len(names) + 7) // 8 * 8
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0,
                                                             0, 64, 3, 2)
    body = header + modinfo + names
    section = struct.Struct("<IIQQQQIIQQ")
    return (body + bytes(shoff - len(body)) + section.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
            + section.pack(1, 1, 2, 0, 64, len(modinfo), 0, 0, 1, 0)
            + section.pack(10, 3, 0, 0, 64 + len(modinfo), len(names), 0, 0, 1, 0))


def tree_with(root: Path, modules: dict[str, bytes]) -> Path:
    """A merged-/usr root (lib -> usr/lib, as Debian's) with modules under /lib/modules/KVER."""
    (root / "usr/lib/modules" / KVER).mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    for rel, data in modules.items():
        path = root / "usr/lib/modules" / KVER / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def verify(module: Path, cert: Path, tmp: Path) -> subprocess.CompletedProcess[bytes]:
    content, signature = split_signature(module.read_bytes())
    assert signature is not None
    (tmp / "content").write_bytes(content)
    (tmp / "sig.der").write_bytes(signature)
    return openssl("cms", "-verify", "-binary", "-inform", "DER", "-in", str(tmp / "sig.der"), "-content",
                   str(tmp / "content"), "-certfile", str(cert), "-nointern", "-noverify", "-out", os.devnull)


# --- the signature -------------------------------------------------------------------------------

def test_a_signed_module_carries_the_kernels_trailer_and_verifies(tmp_path: Path, keys: tuple[Path, Path, Path],
                                                                  key: SigningKey) -> None:
    original = tiny_module("nftest")
    root = tree_with(tmp_path / "root", {"updates/dkms/nftest.ko": original})
    assert sign_modules(root, KVER, key) == [f"usr/lib/modules/{KVER}/updates/dkms/nftest.ko"]
    module = root / "usr/lib/modules" / KVER / "updates/dkms/nftest.ko"
    data = module.read_bytes()
    assert data.startswith(original) and data.endswith(MAGIC)
    info = data[-len(MAGIC) - 12:-len(MAGIC)]
    algo, hash_, id_type, signer_len, key_id_len, pad, sig_len = struct.unpack(">BBBBB3sI", info)
    assert (algo, hash_, id_type, signer_len, key_id_len, pad) == (0, 0, 2, 0, 0, b"\0\0\0")
    assert len(data) == len(original) + sig_len + 12 + len(MAGIC)
    # the signature is what `openssl cms` makes with sign-file's options (RSA PKCS#1 v1.5 is deterministic)
    (tmp_path / "plain.ko").write_bytes(original)
    cli = openssl("cms", "-sign", "-binary", "-noattr", "-nocerts", "-outform", "DER", "-md", "sha256",
                  "-signer", str(keys[1]), "-inkey", str(keys[0]), "-in", str(tmp_path / "plain.ko"))
    assert cli.returncode == 0 and split_signature(data)[1] == cli.stdout
    assert verify(module, keys[1], tmp_path).returncode == 0


def asn1_shape(der: bytes) -> list[str]:
    """Depth, type and object names of a DER structure: its shape without lengths or values."""
    out = openssl("asn1parse", "-inform", "DER", stdin=der)
    assert out.returncode == 0, out.stderr
    shape = []
    for line in out.stdout.decode().splitlines():
        m = re.match(r"\s*\d+:d=(\d+)\s+hl=\s*\d+\s+l=\s*\d+\s+(prim|cons):\s*(.*?)\s*(?::(.*))?$", line)
        assert m, line
        depth, kind, typ, value = m.groups()
        shape.append(f"{depth} {kind} {typ.strip()}" + (f" {value}" if typ.strip() == "OBJECT" else ""))
    return shape


def test_the_signature_has_the_shape_of_the_kernels_own(tmp_path: Path, key: SigningKey) -> None:
    """Debian's kernel build signed loop.ko with scripts/sign-file: ours parses the same way and its CMS
    structure is the same (sha256, issuer and serial, no certificates, no signed attributes)."""
    trailer = (FIXTURES / "debian-loop.ko.trailer").read_bytes()
    content, debian = split_signature(b"\x7fELF module body" + trailer)
    assert content == b"\x7fELF module body" and debian is not None and len(debian) == 681
    root = tree_with(tmp_path, {"updates/dkms/nftest.ko": tiny_module("nftest")})
    sign_modules(root, KVER, key)
    module = (root / "usr/lib/modules" / KVER / "updates/dkms/nftest.ko").read_bytes()
    ours = split_signature(module)[1]
    assert ours is not None and asn1_shape(ours) == asn1_shape(debian)
    header = slice(-len(MAGIC) - 12, -len(MAGIC) - 4)  # algo, hash, id_type, signer_len, key_id_len, pad[3]
    assert module[header] == trailer[header] == bytes([0, 0, 2, 0, 0, 0, 0, 0])


def test_modinfo_names_the_certificates_signer(tmp_path: Path, key: SigningKey) -> None:
    if not shutil.which("modinfo"):
        pytest.skip("modinfo (kmod) is not installed on this host: the signer is not read back")
    root = tree_with(tmp_path, {"updates/dkms/nftest.ko": tiny_module("nftest")})
    sign_modules(root, KVER, key)
    module = root / "usr/lib/modules" / KVER / "updates/dkms/nftest.ko"
    out = subprocess.run(["modinfo", str(module)], capture_output=True, text=True, check=True).stdout
    assert f"signer:         {CN}\n" in out and "sig_id:         PKCS#7" in out and "sig_hashalgo:   sha256" in out
    assert "name:           nftest" in out


def test_a_tampered_module_fails_verification(tmp_path: Path, keys: tuple[Path, Path, Path], key: SigningKey) -> None:
    root = tree_with(tmp_path / "root", {"updates/dkms/nftest.ko": tiny_module("nftest")})
    sign_modules(root, KVER, key)
    module = root / "usr/lib/modules" / KVER / "updates/dkms/nftest.ko"
    data = bytearray(module.read_bytes())
    data[100] ^= 0x01  # inside .modinfo
    module.write_bytes(bytes(data))
    result = verify(module, keys[1], tmp_path)
    assert result.returncode != 0 and b"Verification failure" in result.stderr


# --- the tree ------------------------------------------------------------------------------------

def test_signing_twice_does_not_double_sign(tmp_path: Path, key: SigningKey) -> None:
    root = tree_with(tmp_path, {"updates/dkms/nftest.ko": tiny_module("nftest")})
    sign_modules(root, KVER, key)
    module = root / "usr/lib/modules" / KVER / "updates/dkms/nftest.ko"
    once = module.read_bytes()
    assert sign_modules(root, KVER, key) == []
    assert module.read_bytes() == once and once.count(MAGIC) == 1


def test_an_unsigned_tree_is_signed_whole_and_nothing_else(tmp_path: Path, keys: tuple[Path, Path, Path],
                                                           key: SigningKey) -> None:
    debian_module = tiny_module("debian")
    root = tree_with(tmp_path / "root", {
        "updates/dkms/nvidia-current.ko": tiny_module("nvidia"),
        "updates/dkms/nvidia-current-uvm.ko": tiny_module("nvidia_uvm"),
        "updates/extra/sub/other.ko": tiny_module("other"),
        "updates/dkms/README": b"not a module",
        "kernel/drivers/debian.ko": debian_module,  # Debian's modules are signed by Debian: not ours to touch
    })
    modules = root / "usr/lib/modules" / KVER
    (modules / "updates/dkms/nvidia-current.ko").chmod(0o600)
    signed = sign_modules(root, KVER, key)
    assert signed == [f"usr/lib/modules/{KVER}/updates/{m}" for m in
                      ("dkms/nvidia-current-uvm.ko", "dkms/nvidia-current.ko", "extra/sub/other.ko")]
    for rel in signed:
        assert verify(root / rel, keys[1], tmp_path).returncode == 0
    assert (modules / "kernel/drivers/debian.ko").read_bytes() == debian_module
    assert (modules / "updates/dkms/README").read_bytes() == b"not a module"
    assert (modules / "updates/dkms/nvidia-current.ko").stat().st_mode & 0o777 == 0o600
    assert not list(modules.rglob(".*.signing"))


def test_a_module_signed_by_another_key_is_signed_again(tmp_path: Path, keys: tuple[Path, Path, Path],
                                                        key: SigningKey) -> None:
    """DKMS signs with a key it generates (which the image must not keep): that signature is replaced."""
    dkms_key = SigningKey.load(make_key(tmp_path / "dkms", cn="DKMS module signing key")[2])
    root = tree_with(tmp_path / "root", {"updates/dkms/nftest.ko": tiny_module("nftest")})
    sign_modules(root, KVER, dkms_key)
    module = root / "usr/lib/modules" / KVER / "updates/dkms/nftest.ko"
    assert verify(module, keys[1], tmp_path).returncode != 0
    assert sign_modules(root, KVER, key) == [f"usr/lib/modules/{KVER}/updates/dkms/nftest.ko"]
    data = module.read_bytes()
    assert data.count(MAGIC) == 1 and split_signature(data)[0] == tiny_module("nftest")
    assert verify(module, keys[1], tmp_path).returncode == 0


def test_the_certificate_goes_into_the_tree_and_no_key_does(tmp_path: Path, keys: tuple[Path, Path, Path],
                                                            key: SigningKey) -> None:
    root = tree_with(tmp_path / "root", {"updates/dkms/nftest.ko": tiny_module("nftest")})
    sign_modules(root, KVER, key)
    der = root / "var/lib/nodeforge/module-signing.der"
    assert der.read_bytes() == openssl("x509", "-in", str(keys[1]), "-outform", "DER").stdout
    assert der.stat().st_mode & 0o777 == 0o644
    assert CN in openssl("x509", "-inform", "DER", "-in", str(der), "-noout", "-subject").stdout.decode()
    private = keys[0].read_bytes()
    assert not [p for p in root.rglob("*") if p.is_file() and private[40:80] in p.read_bytes()]
    assert next(rc for rc in rootfs.ROOTFS_CHECKS if rc.check.name == "rootfs/private-key").find(root) == []
    assert key.fingerprint == hashlib.sha256(der.read_bytes()).hexdigest()


def test_no_updates_directory_signs_nothing_but_installs_the_certificate(tmp_path: Path, key: SigningKey) -> None:
    root = tree_with(tmp_path, {"kernel/drivers/debian.ko": tiny_module("debian")})
    assert sign_modules(root, KVER, key) == []
    assert (root / "var/lib/nodeforge/module-signing.der").is_file()


@pytest.mark.parametrize("name", ["nvidia-current.ko.xz", "nvidia-current.ko.zst"])
def test_a_compressed_module_is_refused(tmp_path: Path, key: SigningKey, name: str) -> None:
    root = tree_with(tmp_path, {f"updates/dkms/{name}": b"compressed"})
    with pytest.raises(BuildFailed, match=r"compressed module.*uncompressed"):
        sign_modules(root, KVER, key)


def test_links_out_of_the_tree_are_refused(tmp_path: Path, key: SigningKey) -> None:
    outside = tmp_path / "host-file.ko"
    outside.write_bytes(b"a host file")
    root = tree_with(tmp_path / "root", {})
    (root / "usr/lib/modules" / KVER / "updates").mkdir()
    (root / "usr/lib/modules" / KVER / "updates/evil.ko").symlink_to(outside)
    with pytest.raises(BuildFailed, match="not a regular file"):
        sign_modules(root, KVER, key)
    (root / "usr/lib/modules" / KVER / "updates/evil.ko").unlink()
    (root / "usr/lib/modules" / KVER / "updates").rmdir()
    (root / "usr/lib/modules" / KVER / "updates").symlink_to(tmp_path)
    with pytest.raises(BuildFailed, match="leads out of the image"):
        sign_modules(root, KVER, key)
    assert outside.read_bytes() == b"a host file"


def test_a_module_hard_linked_to_a_cached_copy_leaves_the_copy_unsigned(tmp_path: Path, key: SigningKey) -> None:
    cached = tmp_path / "engine-copy.ko"
    cached.write_bytes(tiny_module("nftest"))
    root = tree_with(tmp_path / "root", {})
    (root / "usr/lib/modules" / KVER / "updates").mkdir()
    os.link(cached, root / "usr/lib/modules" / KVER / "updates/nftest.ko")
    assert len(sign_modules(root, KVER, key)) == 1
    assert cached.read_bytes() == tiny_module("nftest")  # a new file in the tree, the shared one untouched


def test_a_certificate_link_left_by_a_layer_is_not_written_through(tmp_path: Path, key: SigningKey) -> None:
    target = tmp_path / "host-file"
    target.write_bytes(b"host")
    root = tree_with(tmp_path / "root", {})
    (root / "var/lib/nodeforge").mkdir(parents=True)
    (root / "var/lib/nodeforge/module-signing.der").symlink_to(target)
    sign_modules(root, KVER, key)
    assert target.read_bytes() == b"host"
    assert not (root / "var/lib/nodeforge/module-signing.der").is_symlink()


# --- loading the key -----------------------------------------------------------------------------

def test_an_encrypted_key_needs_its_passphrase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    both = make_key(tmp_path, passphrase="correct horse")[2]
    monkeypatch.delenv(signing.PASSPHRASE_ENV, raising=False)
    with pytest.raises(UsageError, match=signing.PASSPHRASE_ENV):
        SigningKey.load(both)
    monkeypatch.setenv(signing.PASSPHRASE_ENV, "wrong")
    with pytest.raises(UsageError, match="reading the private key failed"):
        SigningKey.load(both)
    monkeypatch.setenv(signing.PASSPHRASE_ENV, "correct horse")
    key = SigningKey.load(both)
    root = tree_with(tmp_path / "root", {"updates/dkms/nftest.ko": tiny_module("nftest")})
    assert len(sign_modules(root, KVER, key)) == 1


def bad_secrets(tmp: Path, keys: tuple[Path, Path, Path]) -> dict[str, tuple[list[str], str]]:
    other_key = make_key(tmp / "other")[0]
    (tmp / "mismatch.pem").write_bytes(other_key.read_bytes() + keys[1].read_bytes())
    (tmp / "not-a-key.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
                                        + keys[1].read_bytes())
    return {
        "unknown name": ([f"db-password={keys[2]}"], "--secret db-password: unknown secret; known: module-signing"),
        "no equals sign": (["module-signing"], "expected NAME=PATH"),
        "twice": ([f"module-signing={keys[2]}", f"module-signing={keys[2]}"], "given twice"),
        "missing file": ([f"module-signing={tmp / 'nope.pem'}"], "no such file"),
        "a directory": ([f"module-signing={tmp}"], "not a regular file"),
        "no key": ([f"module-signing={keys[1]}"], "holds no PEM private key"),
        "no certificate": ([f"module-signing={keys[0]}"], "holds no X.509 certificate"),
        "key of another certificate": ([f"module-signing={tmp / 'mismatch.pem'}"],
                                       "the private key does not belong to the certificate (CN=" + CN),
        "garbage key": ([f"module-signing={tmp / 'not-a-key.pem'}"], "reading the private key failed"),
    }


CASES = ["unknown name", "no equals sign", "twice", "missing file", "a directory", "no key", "no certificate",
         "key of another certificate", "garbage key"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_secret_exits_2_saying_what_to_do(case: str, tmp_path: Path, keys: tuple[Path, Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    values, message = bad_secrets(tmp_path, keys)[case]
    argv = ["--root", str(tmp_path), "build", "gpu-node"]
    for v in values:
        argv += ["--secret", v]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: --secret") and "Traceback" not in err
    assert "PRIVATE KEY" not in err and keys[0].read_text().splitlines()[1] not in err


def test_an_unreadable_key_file_exits_2(tmp_path: Path, keys: tuple[Path, Path, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    locked = tmp_path / "locked.pem"
    locked.write_bytes(keys[2].read_bytes())
    locked.chmod(0)
    assert main(["--root", str(tmp_path), "build", "gpu-node", "--secret", f"module-signing={locked}"]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_a_good_secret_is_loaded_with_its_fingerprint(keys: tuple[Path, Path, Path], key: SigningKey) -> None:
    secrets = signing.load_secrets([f"module-signing={keys[2]}"])
    assert secrets.module_signing == key and key.subject == f"CN={CN}" and len(key.fingerprint) == 64
    assert signing.load_secrets([]).module_signing is None
