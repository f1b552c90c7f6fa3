"""Signing keys made by openssl for tests: a module-signing key and its self-signed certificate."""

from __future__ import annotations

import subprocess
from pathlib import Path

CN = "nodeforge test module signing"


def openssl(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)


def make_key(d: Path, cn: str = CN, passphrase: str | None = None) -> tuple[Path, Path, Path]:
    """(key.pem, cert.pem, key and certificate in one file) made by openssl."""
    d.mkdir(parents=True, exist_ok=True)
    key, cert, both = d / "key.pem", d / "cert.pem", d / "signing_key.pem"
    pw = ["-aes256", "-pass", f"pass:{passphrase}"] if passphrase else []
    assert openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", *pw, "-out", str(key)) \
        .returncode == 0
    assert openssl("req", "-new", "-x509", "-key", str(key), "-days", "3650", "-subj", f"/CN={cn}", "-out",
                   str(cert), *(["-passin", f"pass:{passphrase}"] if passphrase else [])).returncode == 0
    both.write_bytes(key.read_bytes() + cert.read_bytes())
    return key, cert, both


def ed25519_pair(d: Path, name: str = "cache") -> tuple[Path, Path]:
    """(NAME.pem, NAME.pub): an Ed25519 key pair, as the fleet cache signs and verifies with."""
    d.mkdir(parents=True, exist_ok=True)
    key, pub = d / f"{name}.pem", d / f"{name}.pub"
    assert openssl("genpkey", "-algorithm", "ed25519", "-out", str(key)).returncode == 0
    assert openssl("pkey", "-in", str(key), "-pubout", "-out", str(pub)).returncode == 0
    return key, pub
