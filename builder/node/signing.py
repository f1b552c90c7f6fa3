"""Secure Boot signing of the modules DKMS built, on the exported root file system.

The key is an explicit input (`nodeforge build --secret module-signing=PATH`, a PEM file holding
the private key and its X.509 certificate, like the kernel's signing_key.pem). It is read in place
by the build host's openssl and never copied: not into an engine layer, not under build/, not into
a log. Only the certificate (DER) enters the tree, for `mokutil --import`.

The signature format is the kernel's (scripts/sign-file.c): the module, a detached CMS signature
in DER (no certificates, no signed attributes, issuer and serial of the certificate), struct
module_signature {algo 0, hash 0, id_type 2 (PKCS#7), signer_len 0, key_id_len 0, pad[3],
be32 sig_len} and the magic string.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildFailed, UsageError
from ..fleetcache.signature import SigningKey as CacheSigningKey

MAGIC = b"~Module signature appended~\n"
PKEY_ID_PKCS7 = 2
SIGNATURE_INFO = struct.Struct(">BBBBB3xI")  # algo, hash, id_type, signer_len, key_id_len, pad[3], sig_len
CERTIFICATE_IN_TREE = "var/lib/nodeforge/module-signing.der"
PASSPHRASE_ENV = "NODEFORGE_MODULE_SIGNING_PASSPHRASE"
SECRETS = {"module-signing": "PEM file with the private key and X.509 certificate that sign the DKMS modules",
           "cache-signing": "PEM file with the Ed25519 private key that signs what this build pushes to the fleet "
                            "cache (--cache)"}
MAX_KEY_FILE = 1024 * 1024
COMPRESSED = (".ko.xz", ".ko.zst", ".ko.gz")

_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_ENCRYPTED = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")
_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True)
class SigningKey:
    path: Path  # the user's file, read in place by openssl
    certificate: bytes  # DER
    subject: str
    encrypted: bool

    @property
    def fingerprint(self) -> str:
        """sha256 of the certificate (DER): what an assembly key records, never the key itself."""
        return hashlib.sha256(self.certificate).hexdigest()

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        """Read and check the key file: a private key, a certificate, and the two belong together."""
        what = f"--secret module-signing={path}"
        text = _read_key_file(path, what)
        if not _PRIVATE_KEY.search(text):
            raise UsageError(f"{what}: the file holds no PEM private key; give the PEM file with both the private "
                             "key and its certificate (cat key.pem cert.pem > signing_key.pem)")
        if _CERTIFICATE not in text:
            raise UsageError(f"{what}: the file holds no X.509 certificate; append the certificate the key signs "
                             "for (cat key.pem cert.pem > signing_key.pem)")
        encrypted = any(marker in text for marker in _ENCRYPTED)
        if encrypted and not os.environ.get(PASSPHRASE_ENV):
            raise UsageError(f"{what}: the private key is encrypted; put its passphrase in the environment "
                             f"variable {PASSPHRASE_ENV}")
        certificate = _openssl(["x509", "-in", str(path), "-outform", "DER"], what, "reading the certificate")
        subject = _openssl(["x509", "-inform", "DER", "-noout", "-subject", "-nameopt", "RFC2253"], what,
                           "reading the certificate", stdin=certificate).decode().strip().removeprefix("subject=")
        cert_public = _openssl(["x509", "-inform", "DER", "-noout", "-pubkey"], what, "reading the certificate",
                               stdin=certificate)
        key_public = _openssl(["pkey", "-in", str(path), "-pubout", *_passin(encrypted)], what,
                              "reading the private key")
        if cert_public.strip() != key_public.strip():
            raise UsageError(f"{what}: the private key does not belong to the certificate ({subject}); put the "
                             "certificate made for this key in the file")
        return cls(path, certificate, subject, encrypted)

    def certificate_pem(self) -> bytes:
        return _openssl(["x509", "-inform", "DER", "-outform", "PEM"], str(self.path), "converting the certificate",
                        stdin=self.certificate)

    def sign(self, content: bytes) -> bytes:
        """The detached CMS signature (DER) of content, as scripts/sign-file makes it."""
        return _openssl(["cms", "-sign", "-binary", "-noattr", "-nocerts", "-nosmimecap", "-outform", "DER",
                         "-md", "sha256", "-signer", str(self.path), "-inkey", str(self.path),
                         *_passin(self.encrypted)], str(self.path), "signing a module", stdin=content,
                        error=BuildFailed)


@dataclass(frozen=True)
class Secrets:
    """What `--secret NAME=PATH` gave: loaded and checked, never copied."""

    module_signing: SigningKey | None = None
    cache_signing: CacheSigningKey | None = None


def load_secrets(values: list[str]) -> Secrets:
    """Parse and check every `--secret NAME=PATH`; unknown names, missing or unusable files exit 2."""
    paths: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not path:
            raise UsageError(f"--secret {value}: expected NAME=PATH, e.g. --secret module-signing=signing_key.pem")
        if name not in SECRETS:
            known = ", ".join(f"{n} ({doc})" for n, doc in SECRETS.items())
            raise UsageError(f"--secret {name}: unknown secret; known: {known}")
        if name in paths:
            raise UsageError(f"--secret {name} given twice; give it once")
        paths[name] = Path(path)
    key, cache = paths.get("module-signing"), paths.get("cache-signing")
    return Secrets(module_signing=SigningKey.load(key) if key else None,
                   cache_signing=CacheSigningKey.load(cache) if cache else None)


def _read_key_file(path: Path, what: str) -> bytes:
    if not path.exists():
        raise UsageError(f"{what}: no such file; give the path of the PEM file with the key and certificate")
    if not path.is_file():
        raise UsageError(f"{what}: not a regular file; give the path of the PEM file with the key and certificate")
    try:
        if path.stat().st_size > MAX_KEY_FILE:
            raise UsageError(f"{what}: larger than {MAX_KEY_FILE // 1024} KiB, not a key file; give the PEM file "
                             "with the key and certificate")
        return path.read_bytes()
    except PermissionError:
        raise UsageError(f"{what}: cannot be read (permission denied); run the build as a user who can read "
                         "it") from None


def _passin(encrypted: bool) -> list[str]:
    return ["-passin", f"env:{PASSPHRASE_ENV}"] if encrypted else []


def _openssl(args: list[str], what: str, doing: str, stdin: bytes | None = None,
             error: type[Exception] = UsageError) -> bytes:
    """Run the build host's openssl (never one from the image); stdin closed so it never prompts."""
    try:
        p = subprocess.run(["openssl", *args], input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                           capture_output=True, check=False)
    except FileNotFoundError:
        raise UsageError("openssl is not installed on the build host; install it (apt install openssl) to sign "
                         "modules") from None
    if p.returncode != 0:
        reason = p.stderr.decode(errors="replace").strip().splitlines()
        raise error(f"{what}: {doing} failed (openssl {args[0]}): {reason[0] if reason else 'no message'}; "
                    "check that the file holds an unencrypted (or passphrase-given) PEM key and its certificate")
    return p.stdout


# --- the module signature ----------------------------------------------------------------------

def split_signature(module: bytes) -> tuple[bytes, bytes | None]:
    """(the module without its signature, the CMS signature or None)."""
    if not module.endswith(MAGIC):
        return module, None
    end = len(module) - len(MAGIC)
    if end < SIGNATURE_INFO.size:
        raise ValueError("signature trailer without its header")
    _, _, id_type, _, _, sig_len = SIGNATURE_INFO.unpack_from(module, end - SIGNATURE_INFO.size)
    start = end - SIGNATURE_INFO.size - sig_len
    if id_type != PKEY_ID_PKCS7 or start < 0:
        raise ValueError(f"unsupported module signature (id_type {id_type}, length {sig_len})")
    return module[:start], module[start:end - SIGNATURE_INFO.size]


def append_signature(content: bytes, signature: bytes) -> bytes:
    return content + signature + SIGNATURE_INFO.pack(0, 0, PKEY_ID_PKCS7, 0, 0, len(signature)) + MAGIC


def signed_by(key: SigningKey, content: bytes, signature: bytes) -> bool:
    """Whether signature is a valid signature of content by key's certificate (host openssl)."""
    with tempfile.TemporaryDirectory(prefix="nodeforge-verify-") as tmp:
        cert, sig, data = Path(tmp, "cert.pem"), Path(tmp, "sig.der"), Path(tmp, "module")
        cert.write_bytes(key.certificate_pem())
        sig.write_bytes(signature)
        data.write_bytes(content)
        p = subprocess.run(["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in", str(sig),
                            "-content", str(data), "-certfile", str(cert), "-nointern", "-noverify",
                            "-out", os.devnull], stdin=subprocess.DEVNULL, capture_output=True, check=False)
        return p.returncode == 0


# --- the tree ----------------------------------------------------------------------------------

def module_dirs(rootfs: Path, kver: str) -> list[Path]:
    """/lib/modules/<kver>/updates (DKMS's place) inside rootfs; a link that leaves the tree is refused."""
    root = rootfs.resolve()
    found: list[Path] = []
    for prefix in ("usr/lib", "lib"):
        d = rootfs / prefix / "modules" / kver / "updates"
        if not d.is_dir():
            continue
        real = d.resolve()
        if not real.is_relative_to(root):
            raise BuildFailed(f"/{prefix}/modules/{kver}/updates leads out of the image's file system ({real}); "
                              "a layer made a link there: remove it")
        if real not in found:
            found.append(real)
    return found


def module_files(rootfs: Path, kver: str) -> list[Path]:
    """Every module file under updates/ (links are refused, compressed modules too)."""
    modules: list[Path] = []
    for d in module_dirs(rootfs, kver):
        for dirpath, _, files in os.walk(d):
            for name in sorted(files):
                path = Path(dirpath, name)
                rel = path.relative_to(rootfs.resolve())
                if name.endswith(COMPRESSED):
                    raise BuildFailed(f"/{rel}: a compressed module; nodeforge signs uncompressed modules only: "
                                      "build it uncompressed (DKMS follows the kernel's CONFIG_MODULE_COMPRESS_*)")
                if not name.endswith(".ko"):
                    continue
                if path.is_symlink() or not path.is_file():
                    raise BuildFailed(f"/{rel}: not a regular file (a link?); modules to sign must be files: "
                                      "remove the link in the layer that made it")
                modules.append(path)
    return sorted(modules)


def sign_module(path: Path, key: SigningKey) -> bool:
    """Sign one module in place; False when it already carries key's signature. A signature by another
    key (DKMS signs with a key it generates, which the image must not keep) is replaced."""
    data = path.read_bytes()
    try:
        content, signature = split_signature(data)
    except ValueError as e:
        raise BuildFailed(f"/{path.name}: {e}; rebuild the module") from None
    if signature is not None and signed_by(key, content, signature):
        return False
    signed = append_signature(content, key.sign(content))
    tmp = path.with_name(f".{path.name}.signing")
    tmp.write_bytes(signed)
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return True


def install_certificate(rootfs: Path, key: SigningKey) -> Path:
    """The certificate (DER) at /var/lib/nodeforge/module-signing.der for `mokutil --import`."""
    dest = rootfs / CERTIFICATE_IN_TREE
    parent = dest.parent
    for p in (rootfs / "var", rootfs / "var/lib", parent):
        if p.is_symlink():
            raise BuildFailed(f"/{p.relative_to(rootfs)} is a link; the certificate is written at "
                              f"/{CERTIFICATE_IN_TREE} only into a real directory: remove the link")
    parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)  # never write through a link a layer left there
    dest.write_bytes(key.certificate)
    os.chmod(dest, 0o644)
    return dest


def sign_modules(rootfs: Path, kver: str, key: SigningKey) -> list[str]:
    """Sign every module under /lib/modules/<kver>/updates that key has not signed yet and put the
    certificate in the tree; returns the paths signed (relative to the tree)."""
    signed = [str(m.relative_to(rootfs.resolve())) for m in module_files(rootfs, kver) if sign_module(m, key)]
    install_certificate(rootfs, key)
    return signed
