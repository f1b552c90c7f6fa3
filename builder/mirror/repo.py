"""The mirror's flat apt repository: Packages (and Packages.gz) from each .deb's control fields
(dpkg-deb, present wherever dpkg is), and a Release with their sha256. apt reads it as
`deb [trusted=yes] file:DIR ./`: trusted because nodeforge checks every file against its index
first, and the Packages entries carry each .deb's sha256, which apt checks again."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
from pathlib import Path

from ..errors import EnvironmentProblem


def control(deb: Path) -> str:
    try:
        proc = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True)
    except FileNotFoundError:
        raise EnvironmentProblem("dpkg-deb is not installed (it comes with dpkg); run `make setup`") from None
    if proc.returncode != 0:
        raise EnvironmentProblem(f"dpkg-deb cannot read {deb.name}: {proc.stderr.strip()}")
    return proc.stdout.rstrip("\n")


def fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def stanza(control_text: str, rel: str, size: int, sha256: str) -> str:
    return f"{control_text}\nFilename: {rel}\nSize: {size}\nSHA256: {sha256}\n"


def write(root: Path, stanzas: list[str]) -> list[str]:
    """Packages, Packages.gz and Release under root; their names (relative)."""
    packages = "\n".join(sorted(stanzas)).encode()
    (root / "Packages").write_bytes(packages)
    (root / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    # a fixed date in the past: the same bytes every time, and never "not valid yet" on a slow clock
    lines = ["Origin: nodeforge", "Label: nodeforge mirror", "Date: Thu, 01 Jan 1970 00:00:00 UTC",
             "Description: the locked packages of nodeforge images, for offline builds", "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        data = (root / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (root / "Release").write_text("\n".join(lines) + "\n")
    return ["Packages", "Packages.gz", "Release"]
