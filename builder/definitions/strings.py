"""String specs with a grammar of their own: absolute paths inside the image, paths under a layer's
files/, octal modes, regular expressions, hosts, IP addresses and URLs."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from .spec import _MISSING, Ctx, Str


@dataclass
class ImagePath(Str):
    """An absolute path inside the image, normalised (`//` and `/./` folded, no trailing `/`):
    two spellings of one path are one path. `..` and the root itself are refused."""

    pattern: str | None = r"/[A-Za-z0-9._+@%:,=~/-]*"
    what: str = "an absolute path inside the image (letters, digits, . _ + @ % : , = ~ - /)"

    def problem(self, value: str) -> str:
        why = super().problem(value)
        if why:
            return why
        parts = value.split("/")
        if ".." in parts:
            return f"expected a path inside the image, found {value!r} (with '..')"
        if not [p for p in parts if p not in ("", ".")]:
            return f"expected a path to a file or directory, found {value!r} (the root itself)"
        return ""

    def normalise(self, value: str) -> str:
        return normalise_image_path(value)

    def remedy(self, value: str) -> str:
        return "write the path it means, without '..', e.g. /etc/x.conf"


def normalise_image_path(value: str) -> str:
    """/etc/./x, /etc//x and /etc/x/ are /etc/x (the path must already have passed ImagePath)."""
    return "/" + "/".join(p for p in value.split("/") if p not in ("", "."))


@dataclass
class RelPath(Str):
    """A path relative to a layer's files/ directory, normalised; it cannot climb out (`..`) and
    the loader also refuses one whose symlinks lead out."""

    pattern: str | None = r"[A-Za-z0-9._+@%:,=~-][A-Za-z0-9._+@%:,=~/-]*"
    what: str = "a path relative to the layer's files/ (no leading '/')"

    def problem(self, value: str) -> str:
        why = super().problem(value)
        if why:
            return why
        if ".." in value.split("/"):
            return f"expected a path inside the layer's files/, found {value!r} (with '..')"
        if not [p for p in value.split("/") if p not in ("", ".")]:
            return f"expected a file name, found {value!r}"
        return ""

    def normalise(self, value: str) -> str:
        return "/".join(p for p in value.split("/") if p not in ("", "."))


@dataclass
class Mode(Str):
    """An octal permission mode as a quoted string: YAML reads a bare 0644 as the number 420."""

    pattern: str | None = r"0?[0-7]{3,4}"
    what: str = "an octal mode as a quoted string such as \"0644\""

    def check(self, value: Any, ctx: Ctx, parent: Any, key: Any, path: str) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            ctx.error(parent, key, path,
                      f"expected {self.what}, found the number {value} (YAML reads a bare 0644 as 420, "
                      f"octal {value:o})", "quote the mode: mode: \"0644\"")
            return _MISSING
        return super().check(value, ctx, parent, key, path)


@dataclass
class Regex(Str):
    """A Python regular expression, compiled when the definition is read."""

    what: str = "a Python regular expression"
    max_len: int = 1024

    def problem(self, value: str) -> str:
        why = super().problem(value)
        if why:
            return why
        try:
            re.compile(value)
        except (re.error, RecursionError, OverflowError) as e:
            return f"expected {self.what}, found {value!r}: {e}"
        return ""


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")


def _address_problem(value: str) -> str:
    """'' when value is an IPv4 address or a bracketed IPv6 address ([::1]), else what is wrong."""
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        ip = ipaddress.ip_address(inner)
    except ValueError:
        return "not an IP address"
    if ip.version == 6 and inner == value:
        return "an IPv6 address goes in brackets, e.g. [::1]"
    if ip.version == 4 and inner != value:
        return "an IPv4 address goes without brackets"
    return ""


@dataclass
class Address(Str):
    """An IP address: IPv4 (0.0.0.0) or IPv6 in brackets ([::]), ready to be joined with ':port'."""

    what: str = "an IP address such as 0.0.0.0 or [::]"
    max_len: int = 64

    def problem(self, value: str) -> str:
        why = super().problem(value)
        if why:
            return why
        inner = _address_problem(value)
        return f"expected {self.what}, found {value!r} ({inner})" if inner else ""


@dataclass
class Host(Str):
    """A host: a DNS name (letters, digits, '-' between dots) or an IP address (IPv6 in brackets)."""

    what: str = "a host name or IP address (IPv6 in brackets)"
    max_len: int = 253

    def problem(self, value: str) -> str:
        why = super().problem(value)
        if why:
            return why
        if value.startswith("[") or re.fullmatch(r"[0-9.]+", value):
            inner = _address_problem(value)
            return f"expected {self.what}, found {value!r} ({inner})" if inner else ""
        if not _DNS_NAME.fullmatch(value):
            return f"expected {self.what}, found {value!r}"
        return ""


# RFC 3986 characters of a path, query and fragment, less the quote "'" (percent-encode it as %27)
_URL_REST = re.compile(r"([A-Za-z0-9._~!$&()*+,;=:@/?#\[\]-]|%[0-9A-Fa-f]{2})*")
_URL = re.compile(r"(?P<scheme>https?)://(?P<authority>[^/?#]*)(?P<rest>.*)", re.S)
_AUTHORITY = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]+)(:(?P<port>[0-9]{1,5}))?")
_FILE_URL = re.compile(r"file:(?P<path>/[A-Za-z0-9._+@%:,=~/-]*)")


@dataclass
class Url(Str):
    """An http(s) URL (and a file: URL where `file` is true): scheme, host[:port], then RFC 3986's
    characters only (no white space, quote, backslash, '<>{}|^`'). User information (user:pass@) is
    refused: credentials do not belong in definitions, logs or records."""

    what: str = "an http(s) URL such as https://example.org/debian/"
    max_len: int = 2048
    file: bool = False

    def problem(self, value: str) -> str:
        why = super().problem(value)
        if why:
            return why
        if self.file and value.startswith("file:"):
            if not _FILE_URL.fullmatch(value) or ".." in value.split("/"):
                return (f"expected a file: URL of an absolute path (letters, digits, . _ + @ % : , = ~ - /; "
                        f"no '..'), found {value!r}")
            return ""
        m = _URL.fullmatch(value)
        if not m:
            return f"expected {self.what}, found {value!r}"
        if "@" in m["authority"]:
            return f"expected {self.what} without user information (user:password@), found {value!r}"
        a = _AUTHORITY.fullmatch(m["authority"])
        if not a or Host().problem(a["host"]) or (a["port"] and not 0 < int(a["port"]) < 65536):
            return f"expected {self.what}, found {value!r} (host[:port] {m['authority']!r})"
        if not _URL_REST.fullmatch(m["rest"]):
            bad = next(c for c in m["rest"] if not _URL_REST.fullmatch(c))
            return f"expected {self.what}, found {bad!r} in {value!r} (percent-encode it)"
        return ""
