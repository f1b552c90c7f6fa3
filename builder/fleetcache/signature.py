"""Ed25519 signatures of cache statements, made and checked by the build host's openssl.

The signing key is a build-time secret (`--secret cache-signing=PEM`): read in place by openssl,
never copied into a layer, a log, build/ or the registry. The public key that pulled entries must
verify against is the operator's (`--cache-public-key PEM`), never a definition's: definitions are
untrusted, and a key named by one would let a pull request vouch for its own entries."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildFailed, UsageError

MAX_KEY_FILE = 64 * 1024


def _openssl(args: list[str], what: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["openssl", *args], input=stdin if stdin is not None else b"", capture_output=True,
                              check=False, timeout=60)
    except FileNotFoundError:
        raise UsageError(f"{what}: openssl is not installed; run `make setup`") from None


def _checked_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise UsageError(f"{what}: no such regular file; give the path of a PEM file")
    if path.stat().st_size > MAX_KEY_FILE:
        raise UsageError(f"{what}: larger than {MAX_KEY_FILE // 1024} KiB, not a key file")


def _algorithm(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first.split(" ")[0] if first else ""


@dataclass(frozen=True)
class SigningKey:
    path: Path  # the operator's file, read in place

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        what = f"--secret cache-signing={path}"
        _checked_file(path, what)
        p = _openssl(["pkey", "-in", str(path), "-noout", "-text", "-passin", "pass:"], what)
        if p.returncode != 0:
            raise UsageError(f"{what}: not an unencrypted PEM private key; make one with "
                             "`openssl genpkey -algorithm ed25519 -out cache-signing.pem`")
        if _algorithm(p.stdout.decode(errors="replace")) != "ED25519":
            raise UsageError(f"{what}: not an Ed25519 key; make one with "
                             "`openssl genpkey -algorithm ed25519 -out cache-signing.pem`")
        return cls(path)

    def sign(self, payload: bytes) -> bytes:
        with tempfile.NamedTemporaryFile(prefix="nodeforge-statement-") as f:
            f.write(payload)
            f.flush()
            p = _openssl(["pkeyutl", "-sign", "-rawin", "-inkey", str(self.path), "-in", f.name], "cache signing")
        if p.returncode != 0 or len(p.stdout) != 64:
            raise BuildFailed(f"signing a cache entry with {self.path} failed: "
                              f"{p.stderr.decode(errors='replace').strip()[-300:]}")
        return p.stdout


@dataclass(frozen=True)
class PublicKey:
    path: Path

    @classmethod
    def load(cls, path: Path) -> PublicKey:
        what = f"--cache-public-key {path}"
        _checked_file(path, what)
        p = _openssl(["pkey", "-pubin", "-in", str(path), "-noout", "-text"], what)
        if p.returncode != 0 or _algorithm(p.stdout.decode(errors="replace")) != "ED25519":
            raise UsageError(f"{what}: not an Ed25519 public key in PEM; make it from the signing key with "
                             "`openssl pkey -in cache-signing.pem -pubout -out cache.pub`")
        return cls(path)

    def verifies(self, payload: bytes, signature: bytes) -> bool:
        with tempfile.TemporaryDirectory(prefix="nodeforge-verify-") as tmp:
            (Path(tmp) / "payload").write_bytes(payload)
            (Path(tmp) / "sig").write_bytes(signature)
            p = _openssl(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey", str(self.path),
                          "-in", str(Path(tmp) / "payload"), "-sigfile", str(Path(tmp) / "sig")], "cache verify")
        return p.returncode == 0 and b"Signature Verified Successfully" in p.stdout
