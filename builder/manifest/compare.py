"""What changed between two rollout manifests, without the engine: the build's identity, layers
(by key), parameters (value and where it was set), packages, wheels, the kernel command line and
the outputs. Printed as text (the default of `nodeforge diff`) or as Markdown for a review."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..escaping import for_markdown_cell, for_markdown_text, for_terminal

# the build's identity: (manifest field, what a reader calls it)
_IDENTITY = (("image", "image"), ("kind", "kind"), ("version", "version"), ("config", "config"),
             ("sets", "--set"), ("plan_key", "plan key"), ("keys", "keys"), ("image_digest", "image digest"),
             ("engine_image_id", "engine image id"),  # format 1 manifests
             ("registry_digest", "registry digest"), ("base", "base"), ("lock", "lock"),
             ("inherited_locks", "locks of parent images"), ("source", "source revision"),
             ("builder", "builder"))


@dataclass(frozen=True)
class Change:
    op: str  # "+" added, "-" removed, "~" changed
    item: str
    old: str = ""
    new: str = ""
    note: str = ""
    detail: tuple[str, ...] = ()  # a unified diff of a text file's lines (bounded: DIFF_LINES)


@dataclass
class Section:
    title: str
    changes: list[Change] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {op: sum(c.op == op for c in self.changes) for op in "+-~"}


def _show(value: Any) -> str:
    if value is None:
        return "null"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


_DIGEST = re.compile(r"(sha256:)?[0-9a-f]{40,}")


def _short(value: Any) -> str:
    """Digests and keys to their first 12 hex digits (as `docker images` shows ids); the rest as is."""
    text = _show(value)
    return text.removeprefix("sha256:")[:12] if _DIGEST.fullmatch(text) else text


def _identity(a: dict[str, Any], b: dict[str, Any]) -> Section:
    s = Section("build")
    for key, title in _IDENTITY:
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if key in ("lock", "source", "base", "keys", "sets"):
            va, vb = _summary(key, va), _summary(key, vb)
            if va == vb:  # keys: the plan key has a row of its own
                continue
        s.changes.append(Change("~", title, _short(va), _short(vb)))
    return s


def _summary(key: str, value: Any) -> str:
    if not value:
        return "none"
    if key == "lock":
        return f"{value['path']} sha256 {value['sha256'][:12]}"
    if key == "base":
        return _base(value)
    if key == "keys":  # a node's content (initramfs) and assembly keys, as node.json names them
        return ", ".join(f"{k} {str(v)[:12]}" for k, v in sorted(value.items()) if v and k != "plan") or "none"
    if key == "sets":
        return " ".join(value)
    return value["revision"][:12] + (" (dirty)" if value.get("dirty") else "")


def _base(base: Any) -> str:
    """The base as one line: `debian bookworm minbase key 3e4485bc916e digest 1a2b3c4d5e6f` or
    `image cuda-12.9-base key ...`."""
    if not isinstance(base, dict):
        return _show(base)
    debian: dict[str, Any] = base["debian"] if isinstance(base.get("debian"), dict) else {}
    what = (f"debian {debian.get('suite', '?')} {debian.get('variant', '')}".rstrip() if base.get("kind") == "debian"
            else f"image {base.get('image')}")
    parts = [what, f"key {str(base.get('key'))[:12]}"]
    if base.get("name"):
        parts.append(f"name {base['name']}")
    if base.get("digest"):
        parts.append(f"digest {_short(base['digest'])}")
    return " ".join(parts)


def keyed(title: str, a: dict[str, str], b: dict[str, str],
           notes: tuple[dict[str, str], dict[str, str]] | None = None) -> Section:
    s = Section(title)
    for k in sorted(set(a) | set(b)):
        na, nb = (notes[0].get(k, ""), notes[1].get(k, "")) if notes else ("", "")
        if k not in b:
            s.changes.append(Change("-", k, old=a[k], note=na))
        elif k not in a:
            s.changes.append(Change("+", k, new=b[k], note=nb))
        elif a[k] != b[k]:
            s.changes.append(Change("~", k, a[k], b[k], na if na == nb else f"{na} -> {nb}"))
    return s


def unordered(title: str, a: set[str], b: set[str]) -> Section:
    return Section(title, [Change("-", x) for x in sorted(a - b)] + [Change("+", x) for x in sorted(b - a)])


def _layers(doc: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Layers by name: their keys (an inherited one's too), and which image built an inherited one."""
    keys, notes = {}, {}
    for x in doc["layers"]:
        inherited = x.get("inherited") or not x.get("key")
        keys[x["name"]] = _short(x["key"]) if x.get("key") else f"from image {x.get('image')}"
        if inherited:
            notes[x["name"]] = f"inherited from image {x.get('image')}"
    return keys, notes


def _parameters(doc: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    values, sources = {}, {}
    for layer in doc["layers"]:
        for name, p in layer.get("parameters", {}).items():
            values[f"{layer['name']}.{name}"] = _show(p["value"])
            sources[f"{layer['name']}.{name}"] = p.get("source", "")
    return values, sources


def _packages(doc: dict[str, Any]) -> dict[str, str]:
    return {p["name"] + (f":{p['architecture']}" if p.get("architecture") else ""): p["version"]
            for p in doc["packages"]}


def _wheels(doc: dict[str, Any]) -> dict[str, str]:
    return {w["name"]: f"{w['version']} (sha256 {str(w.get('sha256'))[:12]})" for w in doc["wheels"]}


def _cmdline(a: dict[str, Any], b: dict[str, Any]) -> Section:
    s = Section("kernel command line")
    ca, cb = a.get("kernel_cmdline") or "", b.get("kernel_cmdline") or ""
    if ca == cb:
        return s
    ta, tb = ca.split(), cb.split()
    s.changes += [Change("-", t, old=t) for t in ta if t not in tb]
    s.changes += [Change("+", t, new=t) for t in tb if t not in ta]
    if not s.changes:
        s.changes.append(Change("~", "order", ca, cb))
    return s


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[Section]:
    """Every section, changed or not (renderers leave out the empty ones)."""
    pa, pb = _parameters(a), _parameters(b)
    la, lb = _layers(a), _layers(b)
    outputs = [{k: _short(v["sha256"]) for k, v in d["outputs"].items()} for d in (a, b)]
    return [
        _identity(a, b),
        keyed("layers", la[0], lb[0], (la[1], lb[1])),
        keyed("parameters", pa[0], pb[0], (pa[1], pb[1])),
        files_section(a, b),
        keyed("packages", _packages(a), _packages(b)),
        keyed("wheels", _wheels(a), _wheels(b)),
        _cmdline(a, b),
        keyed("outputs", outputs[0], outputs[1]),
    ]


DIFF_LINES = 40  # the most lines of one file's unified diff shown


def _file(f: dict[str, Any]) -> str:
    return f"sha256 {str(f.get('sha256'))[:12]} mode {f.get('mode') or '?'}"


def _file_note(f: dict[str, Any]) -> str:
    return f"layer {f.get('layer')}" + (f" of image {f.get('image')}" if f.get("inherited") else "")


def _lines_diff(path: str, a: list[str] | None, b: list[str] | None) -> tuple[str, ...]:
    if a is None or b is None:
        return ()
    out = list(difflib.unified_diff(a, b, f"a{path}", f"b{path}", n=1, lineterm=""))
    if len(out) > DIFF_LINES:
        out = [*out[:DIFF_LINES], f"... {len(out) - DIFF_LINES} more lines"]
    return tuple(out)


def files_section(a: dict[str, Any], b: dict[str, Any]) -> Section:
    """The files the layers write (format 3): by path, the writing layer in the note, the changed
    lines of a small /etc text file as a unified diff."""
    fa, fb = ({f["path"]: f for f in d.get("files") or []} for d in (a, b))
    s = keyed("files", {p: _file(f) for p, f in fa.items()}, {p: _file(f) for p, f in fb.items()},
              ({p: _file_note(f) for p, f in fa.items()}, {p: _file_note(f) for p, f in fb.items()}))
    s.changes = [Change(c.op, c.item, c.old, c.new, c.note,
                        _lines_diff(c.item, (fa.get(c.item) or {}).get("lines") if c.op != "+" else [],
                                    (fb.get(c.item) or {}).get("lines") if c.op != "-" else []))
                 for c in s.changes]
    return s


def changed(sections: list[Section]) -> bool:
    return any(s.changes for s in sections)


# --- text -----------------------------------------------------------------------------------------
def _line(c: Change) -> str:
    """One change as one printable line: what a manifest says is shown escaped (builder.escaping)."""
    t = for_terminal
    note = f" ({t(c.note)})" if c.note else ""
    if c.op == "~":
        return f"  ~ {t(c.item)} {t(c.old)} -> {t(c.new)}{note}"
    value = c.old if c.op == "-" else c.new
    return f"  {c.op} {t(c.item)}" + (f" {t(value)}" if value and value != c.item else "") + note


def text(title_a: str, title_b: str, sections: list[Section]) -> list[str]:
    out = [f"--- {for_terminal(title_a)}", f"+++ {for_terminal(title_b)}"]
    for s in sections:
        if s.changes:
            out.append(f"{s.title}:")
            for c in s.changes:
                out += [_line(c), *(f"      {for_terminal(d)}" for d in c.detail)]
    return out


def describe(path: str, doc: dict[str, Any]) -> str:
    """The headline of one side: file, image, version, plan key, source revision."""
    rev = doc.get("source")
    return (f"{path} ({doc['image']} {doc['version']}, plan {doc['plan_key'][:12]}"
            + (f", revision {_summary('source', rev)}" if rev else "") + ")")


# --- Markdown -------------------------------------------------------------------------------------
_OPS = {"+": "added", "-": "removed", "~": "changed"}


def cell(value: str) -> str:
    """A table cell: one printable line in a code span, pipes escaped (builder.escaping)."""
    return for_markdown_cell(value)


def headline(sections: list[Section]) -> str:
    parts = []
    for s in sections:
        n = s.counts()
        total = sum(n.values())
        detail = ", ".join(f"{n[op]} {_OPS[op]}" for op in "+-~" if n[op])
        parts.append(f"**{s.title}**: " + (f"{total} ({detail})" if total else "unchanged"))
    return " · ".join(parts)


def markdown(title: str, facts: list[tuple[str, str, str]], sections: list[Section]) -> list[str]:
    """A review-ready summary: a title, the two sides, headline counts, then one table per section
    that changed."""
    out = [f"## {title}", "", "| | before | after |", "|---|---|---|"]
    out += [f"| {name} | {cell(a)} | {cell(b)} |" for name, a, b in facts]
    out += ["", headline(sections) if changed(sections) else "**No changes.**"]
    for s in sections:
        if not s.changes:
            continue
        notes = any(c.note for c in s.changes)
        out += ["", f"### {s.title[0].upper()}{s.title[1:]}", "",
                "| change | item | before | after |" + ((" where set |" if s.title == "parameters" else " note |")
                                                        if notes else ""),
                "|---|---|---|---|" + ("---|" if notes else "")]
        for c in s.changes:
            row = f"| {_OPS[c.op]} | {cell(c.item)} | {cell(c.old)} | {cell(c.new)} |"
            out.append(row + (f" {cell(c.note) if c.note else ''} |" if notes else ""))
        for c in s.changes:  # an indented code block: each line printable, nothing in it is markup
            if c.detail:
                out += ["", f"{for_markdown_text(c.item)}:", "", *(f"    {for_terminal(d)}" for d in c.detail)]
    return out


def markdown_for(path_a: str, path_b: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    def rev(d: dict[str, Any]) -> str:
        return _summary("source", d.get("source")) if d.get("source") else "unknown"

    def lock(d: dict[str, Any]) -> str:
        return _summary("lock", d.get("lock"))

    facts = [("manifest", path_a, path_b), ("image", f"{a['image']} {a['version']}", f"{b['image']} {b['version']}"),
             ("plan key", a["plan_key"][:12], b["plan_key"][:12]), ("source revision", rev(a), rev(b)),
             ("lock", lock(a), lock(b))]
    title = (f"Rollout review: {for_markdown_text(a['image'])} {for_markdown_text(a['version'])} → "
             f"{for_markdown_text(b['image'])} {for_markdown_text(b['version'])}")
    return markdown(title, facts, compare(a, b))
