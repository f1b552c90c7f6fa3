"""Debian version ordering, as dpkg --compare-versions orders them (Debian Policy 5.6.12):
epoch, then upstream version, then revision; within each, runs of non-digits compare by
character ('~' before everything, even the end; letters before other characters), runs of
digits numerically."""

from __future__ import annotations


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i, j = i + 1, j + 1
        na = nb = ""
        while i < len(a) and a[i].isdigit():
            na, i = na + a[i], i + 1
        while j < len(b) and b[j].isdigit():
            nb, j = nb + b[j], j + 1
        if int(na or 0) != int(nb or 0):
            return -1 if int(na or 0) < int(nb or 0) else 1
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, sep, rest = version.partition(":")
    if not sep:
        epoch, rest = "0", version
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch or 0), upstream, revision


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as a sorts before, equal to or after b."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def newer(a: str, b: str) -> bool:
    return compare(a, b) > 0
