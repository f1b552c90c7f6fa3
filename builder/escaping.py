"""Escaping for what people read: every human-facing writer (the terminal's diff, plan --explain,
error messages and progress lines; the Markdown of a rollout review) shows a value it did not make
through one of these, so a value from a definition, a manifest or an image is shown as text and
never acts as syntax.

- the terminal: one printable line; a control character (ESC, newline, carriage return, C1 controls,
  Unicode line separators and format characters such as bidirectional overrides) is shown as its
  Python escape (`\\x1b`, `\\n`, `\\u202e`), never sent to the terminal.
- Markdown text (a title, a line of prose): one printable line, every character that Markdown,
  GitHub's autolinks or HTML would read as syntax backslash-escaped, and a leading character that
  would start a block (a heading, list, quote, table or fence) escaped as well.
- a Markdown table cell: one printable line in a code span (nothing in it is a link, emphasis or
  HTML), its fence longer than any run of backticks in the value, pipes escaped (a GFM table splits
  cells on them even inside code spans).

The bottom of the package (it imports nothing of it): errors and every stage above may use it."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["for_markdown_cell", "for_markdown_text", "for_terminal"]

# characters Markdown (CommonMark, GFM tables and strikethrough) or HTML read as syntax; a GFM
# autolink (`https://`, `www.`) is broken by escaping its `:` or `.`
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#|~&!])")
_SCHEME = re.compile(r"://")
# a line that starts with one of these would start a block: a list item (`- `, `+ `, `1. `, `1) `), a
# thematic break or setext underline (`---`, `===`); the other block starters are escaped everywhere
_BLOCK_START = re.compile(r"^( *)([-+](?= |$)|\d{1,9}(?=[.)]( |$))|[-=][-= ]*$)")
_WWW = re.compile(r"(?i)\bwww\.")


def _escape_char(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")


def for_terminal(value: Any) -> str:
    """`value` as one printable line: a character that is not printable is shown as its escape."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def for_markdown_text(value: Any) -> str:
    """`value` as inert Markdown text: one line, no heading, list, link, emphasis, code or HTML."""
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", for_terminal(value))
    text = _WWW.sub(lambda m: m.group()[:-1] + "\\.", _SCHEME.sub("\\://", text))
    m = _BLOCK_START.match(text)
    if m:
        lead, mark = m.group(1), m.group(2)
        start = len(lead)
        if mark.isdigit():  # `1.` or `1)`: escape the punctuation after the number
            end = start + len(mark)
            text = text[:end] + "\\" + text[end:]
        else:
            text = text[:start] + "\\" + text[start:]
    return text


def for_markdown_cell(value: Any) -> str:
    """`value` as an inert table cell: one line in a code span, pipes escaped; '' stays ''."""
    text = for_terminal(value)
    if not text:
        return ""
    text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or (text.startswith(" ") and text.endswith(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"
