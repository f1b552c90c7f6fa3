"""Secrets in an image: the ones well-known packages generate at install, the credential files a
build must never leave, and the per-file test the root-file-system checks apply both to the final
tree (checks.rootfs) and to every layer of an image on its own (manifest.layer_secrets): a file
removed by a later layer is hidden from the final tree but still shipped in its own layer.

The package phase removes GENERATED at the end of its own script (compose.phases), so that the
layer that installs such a package never carries what its postinst made; nodes and containers
make their own at first boot (the kernel layer's first-boot unit runs `ssh-keygen -A`; systemd
makes a machine-id)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

KEY_DIRS = ("etc", "root", "var/lib", "usr/local", "opt", "home")  # where a private key would be kept
KEY_SCAN_MAX = 64 * 1024  # a key file is small; larger files are not read
PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
SSH_HOST_KEY = "etc/ssh/ssh_host_*_key"
MACHINE_ID = re.compile(rb"\s*[0-9a-fA-F]{32}\s*")
# names of the root-file-system checks a layer's finding carries (checks.rootfs registers them)
HOST_KEYS, MACHINE, PRIVATE, SECRET_FILE = ("rootfs/ssh-host-keys", "rootfs/machine-id", "rootfs/private-key",
                                            "rootfs/secret-file")


@dataclass(frozen=True)
class Generated:
    pattern: str  # an absolute path or shell glob
    package: str  # the package whose postinst (or first run) makes it
    empty: bool = False  # emptied, not removed (a machine-id: its empty file tells systemd to make one)


GENERATED: tuple[Generated, ...] = (
    Generated("/etc/ssh/ssh_host_*_key", "openssh-server"),
    Generated("/etc/ssh/ssh_host_*_key.pub", "openssh-server"),
    Generated("/etc/munge/munge.key", "munge"),
    Generated("/etc/ssl/private/ssl-cert-snakeoil.key", "ssl-cert"),
    Generated("/etc/ssl/certs/ssl-cert-snakeoil.pem", "ssl-cert"),
    Generated("/var/lib/dkms/mok.key", "dkms"),
    Generated("/var/lib/dkms/mok.pub", "dkms"),
    Generated("/var/lib/shim-signed/mok/MOK.priv", "shim-signed"),
    Generated("/var/lib/dbus/machine-id", "dbus"),
    Generated("/var/lib/systemd/random-seed", "systemd"),
    Generated("/var/lib/systemd/credential.secret", "systemd"),
    Generated("/etc/machine-id", "systemd", empty=True),
)
# files that hold credentials: none belongs in an image (rootfs/secret-file)
CREDENTIALS = ("etc/apt/auth.conf", "etc/apt/auth.conf.d/*", "root/.netrc", "home/*/.netrc", "root/.git-credentials",
               "home/*/.git-credentials", "root/.docker/config.json", "home/*/.docker/config.json", "root/.pypirc",
               "home/*/.pypirc", "root/.aws/credentials", "home/*/.aws/credentials")
# the generated secrets a final tree or a layer must not hold (rootfs/secret-file); host keys, the
# machine-id and PEM or MOK keys have checks of their own; public halves and certificates are not secret
SECRET_FILES = ("etc/munge/munge.key", "var/lib/systemd/random-seed", "var/lib/systemd/credential.secret",
                *CREDENTIALS)


def removal_lines() -> list[str]:
    """The end of the package phase's script: what the packages generated, removed in their own layer."""
    lines = ["# secrets that packages generate at install (nodeforge checks.secrets.GENERATED): removed in the",
             "# layer that made them; nodes and containers make their own at first boot"]
    for g in GENERATED:
        if g.empty:
            lines.append(f"if [ -s {g.pattern} ]; then : > {g.pattern}; fi  # {g.package}: emptied, made at boot")
        else:
            lines.append(f"rm -f {g.pattern}  # {g.package}")
    lines.append("find /etc/ssl/certs -maxdepth 1 -lname ssl-cert-snakeoil.pem -delete 2>/dev/null || true")
    return lines


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def is_private_key(name: str, head: bytes) -> bool:
    """A PEM private key (any kind), or DKMS's and shim's MOK keys (DER, no PEM marker) by name."""
    lower = name.lower()
    return lower == "mok.key" or lower.endswith(".priv") or bool(PEM_PRIVATE_KEY.search(head))


def in_key_dirs(rel: str) -> bool:
    return any(rel == d or rel.startswith(d + "/") for d in KEY_DIRS)


def classify(rel: str, size: int, read: Callable[[], bytes]) -> str | None:
    """The check a regular file of a layer (or a tree) fails, or None: rel is its path without the
    leading slash; read returns its first KEY_SCAN_MAX bytes (called only where content matters)."""
    if fnmatch.fnmatchcase(rel, SSH_HOST_KEY):
        return HOST_KEYS
    if rel == "etc/machine-id":
        return MACHINE if size and MACHINE_ID.fullmatch(read()) else None
    if rel == "var/lib/dbus/machine-id":
        return MACHINE if size else None
    if _matches(rel, SECRET_FILES):
        return SECRET_FILE if size else None
    if in_key_dirs(rel) and size <= KEY_SCAN_MAX and is_private_key(rel.rsplit("/", 1)[-1], read() if size else b""):
        return PRIVATE
    return None
