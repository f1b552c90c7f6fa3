"""sysctl keys and values: shape checks for /etc/sysctl.d entries."""

from __future__ import annotations

import re

NAMESPACES = ("abi", "crypto", "debug", "dev", "fs", "kernel", "net", "sunrpc", "user", "vm")
_KEY = re.compile(r"[a-z][a-z0-9_]*([./][A-Za-z0-9_@:+-]+)+")


def check_key(key: str) -> tuple[str, str] | None:
    top = re.split(r"[./]", key, maxsplit=1)[0]
    if top not in NAMESPACES:
        return (f"{key!r} is not in a sysctl namespace ({', '.join(NAMESPACES)})",
                "write the key as it appears under /proc/sys with dots, e.g. vm.swappiness")
    if not _KEY.fullmatch(key):
        return (f"{key!r} is not a well-formed sysctl key",
                "use dot-separated components of letters, digits and '_', e.g. net.core.rmem_max")
    return None


def check_value(value: str) -> tuple[str, str] | None:
    if value == "" or "\n" in value:
        return ("a sysctl value must be non-empty and on one line", "give the value as /proc/sys shows it")
    return None


def normalise(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return " ".join(str(value).split())
