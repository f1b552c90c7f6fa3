"""One file inside an archive or filesystem image, as the reproducibility comparison sees it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    kind: str  # file, dir, link, hardlink, other
    size: int
    mode: int
    mtime: int
    sha256: str
    target: str = ""

    def describe(self) -> str:
        what = f"{self.kind} {self.size} bytes mode {self.mode:o} mtime {self.mtime}"
        what += f" sha256 {self.sha256[:16]}" if self.sha256 else ""
        return what + (f" -> {self.target}" if self.target else "")
