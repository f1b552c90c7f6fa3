"""Two contents of one path as a short diff on one line: what a file conflict shows instead of two
sha256 digests. Imports nothing of the composer, so that scope (where conflicts are found) can use
it."""

from __future__ import annotations

import difflib

CONFLICT_CHANGES = 3  # the most changed places a conflict names


def _text_lines(data: str | bytes | None) -> list[str] | None:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None if data is None or "\0" in data else data.splitlines()


def short_diff(old: str | bytes | None, new: str | bytes | None) -> str:
    """Two contents of one path as a short diff on one line (a problem's message is one line):
    `line 2: 'y = 2' -> 'y = 3'`, at most CONFLICT_CHANGES places; a binary content by its size."""
    a, b = _text_lines(old), _text_lines(new)
    if a is None or b is None:
        return "not text: " + " vs ".join(f"{len(d)} bytes" if d is not None else "unknown" for d in (old, new))
    places = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        before, after = " / ".join(a[i1:i2]) or "(nothing)", " / ".join(b[j1:j2]) or "(nothing)"
        where = f"line {i1 + 1}" if i2 - i1 <= 1 else f"lines {i1 + 1}-{i2}"
        places.append(f"{where}: {before!r} -> {after!r}" if op == "replace" else
                      f"{where}: {before!r} removed" if op == "delete" else f"{where}: {after!r} added")
    if not places:
        return "the same lines, other bytes (line endings or a final newline)"
    more = len(places) - CONFLICT_CHANGES
    return "; ".join(places[:CONFLICT_CHANGES]) + (f"; {more} more" if more > 0 else "")
