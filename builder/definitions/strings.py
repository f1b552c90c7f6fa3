"""String specs with a grammar of their own: absolute paths inside the image, paths under a layer's
files/, octal modes and regular expressions."""

from __future__ import annotations

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
