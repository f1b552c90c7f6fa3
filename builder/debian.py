"""Debian knowledge shared by the stages: package names, the package database, apt's install line."""

from __future__ import annotations

PKG_PATTERN = r"[a-z0-9][a-z0-9+.-]+"  # a Debian package name
APT_INSTALL = ("apt-get install -y -q --no-install-recommends "
               "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")


# what apt and dpkg read while they install: written in the package phase, before any install
PACKAGE_CONFIG_DIRS = ("/etc/apt/", "/etc/dpkg/", "/usr/share/keyrings/", "/etc/debconf.conf")


def file_phase(path: str) -> str:
    """The build phase a layer file is written in when the layer does not say (compose.phases)."""
    return "packages" if path.startswith(PACKAGE_CONFIG_DIRS) else "config"


def parse_dpkg_status(text: str) -> dict[str, dict[str, str]]:
    """Installed packages: name -> fields (Version, Status, ...)."""
    out: dict[str, dict[str, str]] = {}
    for para in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in para.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            name = fields["Package"]
            arch = fields.get("Architecture", "")
            out[name if arch in ("", "all", "amd64") else f"{name}:{arch}"] = fields
    return out
