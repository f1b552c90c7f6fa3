"""Root-file-system hygiene of a node image, as named checks (bootc's lints) run by the assembler on
the exported file system. What the engine leaves behind and what must not be baked into a golden
image is fixed and reported; what a layer should not leave is reported; a root that cannot boot
(no kernel, two kernels, no initrd) stops the assembly."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import secrets
from .registry import Check, check
from .secrets import KEY_DIRS, KEY_SCAN_MAX

HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
SSH_HOST_KEY = re.compile(r"etc/ssh/ssh_host_[^/]*_key")  # rootfs/ssh-host-keys removes those


@dataclass(frozen=True)
class Finding:
    check: Check
    found: str  # what was there
    action: str  # removed, emptied, rewritten, left (a warning) or fatal

    def render(self) -> str:
        return f"{self.check.name}: {self.found} ({self.action})"


@dataclass(frozen=True)
class RootfsCheck:
    check: Check
    find: Callable[[Path], list[str]]  # relative paths (or facts) found
    fix: Callable[[Path, list[str]], str] | None  # returns the action; None: report only
    fatal: bool = False


def replace_text(path: Path, text: str) -> None:
    """Write a file of the tree as a new inode: the tree's files may be hard links to the engine's."""
    path.unlink(missing_ok=True)
    path.write_text(text)


def _existing(*rels: str) -> Callable[[Path], list[str]]:
    return lambda root: [r for r in rels if (root / r).is_file() or (root / r).is_symlink()]


def _remove(root: Path, found: list[str]) -> str:
    for rel in found:
        (root / rel).unlink(missing_ok=True)
    return "removed"


def _machine_id(root: Path) -> list[str]:
    found = [r for r in ("var/lib/dbus/machine-id",) if (root / r).exists() or (root / r).is_symlink()]
    mid = root / "etc/machine-id"
    if not mid.exists() or mid.read_text().strip():
        found.append("etc/machine-id")
    return found


def _fix_machine_id(root: Path, found: list[str]) -> str:
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    replace_text(root / "etc/machine-id", "")  # empty: systemd makes one on first boot
    return "emptied"


def _hosts(root: Path) -> list[str]:
    p = root / "etc/hosts"
    return [] if p.is_file() and p.read_text() == HOSTS else ["etc/hosts"]


def _fix_hosts(root: Path, found: list[str]) -> str:
    replace_text(root / "etc/hosts", HOSTS)
    return "rewritten"


def _baked_resolv(root: Path) -> list[str]:
    """A resolv.conf file (not a link, to systemd-resolved's for example): the engine's empty one, or
    the build host's, which the bootstrap copies (mmdebstrap does, as debootstrap did)."""
    p = root / "etc/resolv.conf"
    return ["etc/resolv.conf"] if p.is_file() and not p.is_symlink() else []


def _host_keys(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "etc/ssh").glob("ssh_host_*_key*"))


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(KEY_SCAN_MAX)
    except OSError:
        return b""


def _is_private_key(path: Path) -> bool:
    if secrets.is_private_key(path.name, b""):  # DKMS's and shim's MOK keys (DER, no PEM marker)
        return True
    try:
        if path.stat().st_size > KEY_SCAN_MAX:
            return False
    except OSError:
        return False
    return secrets.is_private_key(path.name, _head(path))


def _secret_files(root: Path) -> list[str]:
    """Generated secrets (a munge key, a random seed) and credential files, non-empty, not links."""
    found = set()
    for pattern in secrets.SECRET_FILES:
        for p in root.glob(pattern):
            if p.is_file() and not p.is_symlink() and p.stat().st_size > 0:
                found.add(str(p.relative_to(root)))
    return sorted(found)


def _private_keys(root: Path) -> list[str]:
    found = []
    for top in KEY_DIRS:
        base = root / top
        if base.is_symlink() or not base.is_dir():
            continue
        for dirpath, _, files in os.walk(base):  # links to directories are not followed
            for name in files:
                path = Path(dirpath, name)
                rel = str(path.relative_to(root))
                if not SSH_HOST_KEY.fullmatch(rel) and not path.is_symlink() and path.is_file() \
                        and _is_private_key(path):
                    found.append(rel)
    return sorted(found)


def _package_lists(root: Path) -> list[str]:
    d = root / "var/lib/apt/lists"
    return sorted(str(p.relative_to(root)) for p in d.glob("*") if p.is_file() and p.name != "lock") if d.is_dir() \
        else []


BUILD_RECORDS = ("var/log/dpkg.log", "var/log/alternatives.log", "var/log/apt/history.log", "var/log/apt/term.log",
                 "var/log/apt/eipp.log.xz", "var/cache/ldconfig/aux-cache")


BUILD_LOGS = "var/lib/dkms/*/*/*/*/log/make.log"  # DKMS's: the date and the build container's name


def _build_records(root: Path) -> list[str]:
    logs = sorted(str(p.relative_to(root)) for p in root.glob(BUILD_LOGS) if p.is_file())
    return [r for r in BUILD_RECORDS if (root / r).is_file() and (root / r).stat().st_size > 0] + logs


def _logs(root: Path) -> list[str]:
    d = root / "var/log"
    return sorted(str(p.relative_to(root)) for p in d.rglob("*") if p.is_file() and p.stat().st_size > 0) \
        if d.is_dir() else []


def kernels(root: Path) -> list[str]:
    return sorted(p.name[len("vmlinuz-"):] for p in (root / "boot").glob("vmlinuz-*"))


def _kernel_count(root: Path) -> list[str]:
    found = kernels(root)
    return [] if len(found) == 1 else [f"kernels in /boot: {', '.join(found) or 'none'}"]


def _initrd(root: Path) -> list[str]:
    found = kernels(root)  # with no kernel or two, rootfs/one-kernel speaks
    if len(found) != 1:
        return []
    return [] if (root / "boot" / f"initrd.img-{found[0]}").exists() else [f"boot/initrd.img-{found[0]}"]


ROOTFS_CHECKS: tuple[RootfsCheck, ...] = (
    RootfsCheck(check("rootfs/engine-leftover", "assemble", "the engine's marker file /.dockerenv is in the root",
                      "nothing to do: the assembler removes it"), _existing(".dockerenv"), _remove),
    RootfsCheck(check("rootfs/hostname", "assemble", "/etc/hostname bakes one name into every node",
                      "nothing to do: the assembler removes it; nodes get their name from DHCP or the site"),
                _existing("etc/hostname"), _remove),
    RootfsCheck(check("rootfs/hosts", "assemble", "/etc/hosts holds the build container's name and address",
                      "nothing to do: the assembler writes the localhost entries only"), _hosts, _fix_hosts),
    RootfsCheck(check("rootfs/machine-id", "assemble", "a machine-id baked in makes every node the same machine",
                      "nothing to do: the assembler empties it; systemd makes one on first boot"),
                _machine_id, _fix_machine_id),
    RootfsCheck(check("rootfs/resolv-conf", "assemble",
                      "/etc/resolv.conf baked in: the engine's empty one or the build host's resolvers",
                      "nothing to do: the assembler removes it; nodes get resolvers from DHCP or the site "
                      "(a symlink, to systemd-resolved's stub for example, is kept)"), _baked_resolv, _remove),
    RootfsCheck(check("rootfs/ssh-host-keys", "assemble", "SSH host keys baked in are shared by every node",
                      "nothing to do: the assembler removes them; the kernel layer makes them on first boot"),
                _host_keys, _remove),
    RootfsCheck(check("rootfs/private-key", "assemble",
                      "a private key (PEM, or a MOK key *.priv / mok.key) is baked in: every node and everyone "
                      "with the image has it",
                      "delete it in the layer that makes it (rm in a step); a Secure Boot module signing key is "
                      "given at build time (nodeforge build --secret module-signing=PATH) and never enters the "
                      "image"), _private_keys, None, fatal=True),
    RootfsCheck(check("rootfs/secret-file", "assemble",
                      "a generated secret (a munge key, a random seed) or a credential file (apt auth.conf, .netrc, "
                      ".git-credentials, a docker config.json, ...) is baked in",
                      "give credentials at build time, never in a file of the image; a package's generated secret "
                      "is removed by the package phase (checks.secrets.GENERATED): a later layer made this one, "
                      "remove it in the step that makes it"), _secret_files, None, fatal=True),
    RootfsCheck(check("rootfs/package-lists", "assemble", "apt package lists left in the image (tens of MB, stale)",
                      "end the layer's installs with `rm -rf /var/lib/apt/lists/*` (packages: does it)"),
                _package_lists, None),
    RootfsCheck(check("rootfs/build-records", "assemble",
                      "what the package managers recorded while building (their logs, ldconfig's aux-cache) holds "
                      "the build's times: two builds of one image would differ",
                      "nothing to do: they are removed from the disks and the root archive"),
                _build_records, _remove),
    RootfsCheck(check("rootfs/logs", "assemble", "log files written while building are shipped in the image",
                      "truncate them in the layer that writes them, or accept them (dpkg and apt logs)"),
                _logs, None),
    RootfsCheck(check("rootfs/one-kernel", "assemble", "a node image boots exactly one kernel from /boot",
                      "add the kernel layer (linux-image-amd64) once; remove other linux-image packages"),
                _kernel_count, None, fatal=True),
    RootfsCheck(check("rootfs/initrd", "assemble", "the kernel in /boot has its initramfs",
                      "the kernel layer installs initramfs-tools; keep it"), _initrd, None, fatal=True),
)


def run(root: Path) -> list[Finding]:
    """Every rootfs check on an exported root: fixes applied, findings returned (fatal ones too)."""
    findings = []
    for rc in ROOTFS_CHECKS:
        found = rc.find(root)
        if not found:
            continue
        action = "fatal" if rc.fatal else rc.fix(root, found) if rc.fix else "left"
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        findings.append(Finding(rc.check, shown, action))
    return findings
