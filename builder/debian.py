"""Debian knowledge shared by the stages: package names, the package database, apt's install line,
and the bootstrap recipe (mmdebstrap's options, the host files dropped, the engine import's changes)
that the base key digests, the bootstrap runs and `render` writes out."""

from __future__ import annotations

from typing import Any

PKG_PATTERN = r"[a-z0-9][a-z0-9+.-]+"  # a Debian package name
APT_INSTALL = ("apt-get install -y -q --no-install-recommends "
               "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")


# what apt and dpkg read while they install: written in the package phase, before any install
PACKAGE_CONFIG_DIRS = ("/etc/apt/", "/etc/dpkg/", "/usr/share/keyrings/", "/etc/debconf.conf")


# the bootstrap recipe: one place, digested into the base key (recipe), run by engine.bootstrap
MMDEBSTRAP_OPTIONS = ("--aptopt=Acquire::Retries \"5\"", "--dpkgopt=force-unsafe-io")
# mmdebstrap copies the build host's resolv.conf and hostname in (for debootstrap's sake) and leaves
# them: the base layer would then differ from host to host. The engine mounts its own into every
# container; a node gets its name and resolvers from DHCP or the site.
DROP_HOST_FILES = 'rm -f "$1/etc/resolv.conf" "$1/etc/hostname"'
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMPORT_CHANGES = (f"ENV PATH={PATH}", 'CMD ["/bin/bash"]')  # `docker import --change`, one each


# a slim base (from.debian.slim), as Debian's own -slim images are made and a little further: dpkg
# keeps documentation (but not the copyright files), man and info pages and translations out, and
# two things a container rarely reads: glibc's iconv modules for CJK and EBCDIC code pages (UTF-8,
# UTF-16/32, ASCII and Latin-1 are built into glibc; the other ISO-8859 sets, the Windows code pages
# and UTF-7 stay) and the leap-second "right/" time zones (Debian 13 moves them to tzdata-legacy).
# mmdebstrap writes each --dpkgopt into the base's /etc/dpkg/dpkg.cfg.d/99mmdebstrap as well, so
# every package installed later follows the same rules (dpkg: the last matching rule wins). Merged
# /usr comes from mmdebstrap's hook (the usr-is-merged package) instead of the usrmerge package,
# which pulls in all of perl (about 47 MB) for a conversion a fresh base does not need. The logs
# the bootstrap wrote are removed.
SLIM_PATH_RULES = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                   "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
                   "path-exclude=/usr/share/groff/*", "path-exclude=/usr/share/lintian/*",
                   "path-exclude=/usr/share/locale/*", "path-include=/usr/share/locale/locale.alias",
                   "path-exclude=/usr/lib/*/gconv/*", "path-include=/usr/lib/*/gconv/gconv-modules*",
                   "path-include=/usr/lib/*/gconv/ISO8859-*.so", "path-include=/usr/lib/*/gconv/CP12*.so",
                   "path-include=/usr/lib/*/gconv/UTF-*.so", "path-include=/usr/lib/*/gconv/UNICODE.so",
                   "path-exclude=/usr/share/zoneinfo/right/*")
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
DROP_BOOTSTRAP_LOGS = ('rm -rf "$1"/var/log/apt/* "$1/var/log/dpkg.log" "$1/var/log/alternatives.log" '
                       '"$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old')


def slim_options(debian: dict[str, Any]) -> list[str]:
    if not debian.get("slim"):
        return []
    return [f"--hook-dir={MERGED_USR_HOOKS}", *(f"--dpkgopt={rule}" for rule in SLIM_PATH_RULES),
            f"--customize-hook={DROP_BOOTSTRAP_LOGS}"]


def mmdebstrap_command(debian: dict[str, Any], out: str) -> list[str]:
    """The mmdebstrap command line that writes the base of `debian` (an image's from.debian) to out."""
    cmd = ["mmdebstrap", f"--variant={debian['variant']}", f"--components={','.join(debian['components'])}",
           *MMDEBSTRAP_OPTIONS, *slim_options(debian), f"--customize-hook={DROP_HOST_FILES}"]
    if debian["include"]:
        cmd.append(f"--include={','.join(debian['include'])}")
    return [*cmd, debian["suite"], out, debian["mirror"], *security_source(debian)]


def security_source(debian: dict[str, Any]) -> list[str]:
    """The security archive as a sources.list line for mmdebstrap (a MIRROR argument that starts with
    "deb " is taken as written), or nothing when the image leaves it out."""
    if not debian.get("security"):
        return []
    return [f"deb {debian['security']} {debian['suite']}-security {' '.join(debian['components'])}"]


def recipe(debian: dict[str, Any], epoch: int) -> dict[str, Any]:
    """The whole bootstrap as data, for the base key: what is run, with what, and how it is imported."""
    return {"bootstrap": mmdebstrap_command(debian, "OUT"), "changes": list(IMPORT_CHANGES),
            "debian": debian, "epoch": epoch}


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
