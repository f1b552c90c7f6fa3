"""rootfs/private-key: a PEM private key or a MOK key anywhere a key is kept stops the assembly,
naming the file; public material, SSH host keys (their own check removes them), large files and
places outside the scanned directories stay quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.checks import rootfs

PEM = "-----BEGIN {kind}PRIVATE KEY-----\nMIIBVgIBADANBgkqhkiG9w0BAQEFAASC\n-----END {kind}PRIVATE KEY-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAV2gAwIBAgIU\n-----END CERTIFICATE-----\n"


CHECK = next(rc for rc in rootfs.ROOTFS_CHECKS if rc.check.name == "rootfs/private-key")


def found(root: Path) -> list[str]:
    return CHECK.find(root)


def put(root: Path, rel: str, data: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)


@pytest.mark.parametrize(("rel", "data"), [
    ("etc/ssl/private/ssl-cert-snakeoil.key", PEM.format(kind="")),
    ("root/.ssh/id_ed25519", PEM.format(kind="OPENSSH ")),
    ("var/lib/site/signing_key.pem", CERT + PEM.format(kind="RSA ")),
    ("usr/local/share/ec.key", PEM.format(kind="EC ")),
    ("opt/vendor/enc.pem", PEM.format(kind="ENCRYPTED ")),
    ("home/user/secring.asc", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQ==\n-----END PGP PRIVATE KEY BLOCK-----\n"),
    ("var/lib/dkms/mok.key", b"\x30\x82\x04\xbd binary DER"),
    ("var/lib/shim-signed/mok/MOK.priv", b"\x30\x82\x04\xbd binary DER"),
])
def test_a_private_key_stops_the_assembly_naming_it(tmp_path: Path, rel: str, data: str | bytes) -> None:
    put(tmp_path, rel, data)
    assert found(tmp_path) == [rel]
    assert CHECK.fatal and CHECK.fix is None and "--secret module-signing=PATH" in CHECK.check.remedy
    assert (tmp_path / rel).exists()  # reported, never silently removed


@pytest.mark.parametrize(("rel", "data"), [
    ("etc/ssl/certs/site.pem", CERT),  # a certificate is public
    ("var/lib/dkms/mok.pub", b"\x30\x82 public DER"),
    ("var/lib/nodeforge/module-signing.der", b"\x30\x82 certificate DER"),
    ("usr/lib/python3/dist-packages/tests/key.pem", PEM.format(kind="")),  # not where a key is kept
    ("etc/big.bin", "x" * rootfs.KEY_SCAN_MAX + PEM.format(kind="")),  # larger than a key file
    ("etc/ssh/ssh_host_ed25519_key", PEM.format(kind="OPENSSH ")),  # rootfs/ssh-host-keys removes it
    ("etc/ssh/ssh_config", "# -----BEGIN ([A-Z]+ )*PRIVATE KEY----- is not a key\n"),
])
def test_no_private_key_keeps_the_check_quiet(tmp_path: Path, rel: str, data: str | bytes) -> None:
    put(tmp_path, rel, data)
    assert found(tmp_path) == []


def test_a_link_to_a_key_outside_the_scanned_places_is_not_followed(tmp_path: Path) -> None:
    put(tmp_path, "srv/key.pem", PEM.format(kind=""))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/key.pem").symlink_to("../srv/key.pem")
    (tmp_path / "opt").symlink_to("srv")
    assert found(tmp_path) == []


def test_every_key_is_reported(tmp_path: Path) -> None:
    for rel in ("etc/a.key", "root/b.key", "var/lib/c/d.key"):
        put(tmp_path, rel, PEM.format(kind=""))
    assert found(tmp_path) == ["etc/a.key", "root/b.key", "var/lib/c/d.key"]
