"""Quoting for every language nodeforge writes a value into. Validation (the grammars of
builder.definitions.grammar) keeps most metacharacters out of definitions; the writers quote
anyway, so that a value the grammar allows arrives as the same text and never as syntax.

- shell (bash apply scripts, Packer provisioners): POSIX single quotes (`shlex.quote`).
- Dockerfile exec-form instructions (RUN, ENTRYPOINT, CMD, COPY): JSON strings.
- Dockerfile ENV and LABEL values and comments: single quotes, which the Dockerfile word lexer
  takes literally (no `$` expansion, no escapes), and `\\'` for a quote between them.
- GRUB script (`grub.cfg`): GRUB's single quotes, in which nothing is special; `'\\''` for a quote.
- iPXE script (`boot.ipxe`): iPXE has no quotes; a value is one word that must not hold white
  space or `${`, so it is refused rather than quoted (`ipxe_word`).
- systemd unit values: `unit_word`, systemd's C-style double quotes with `\\\\`, `\\"`, `%%`;
  `unit_value` leaves a plain word bare (what a template's `{{ }}` in a unit file renders).
- apt deb822 sources: one field value per line, no newline or leading space (`deb822_value`).
- sysctl.d and modprobe.d lines: the value ends at the end of the line (`config_line_value`)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


class Unquotable(ValueError):
    """A value that the target language cannot hold at all (a newline in a one-line format)."""


def _no_control(value: str, where: str) -> str:
    m = _CONTROL.search(value)
    if m:
        raise Unquotable(f"{where} cannot hold control character U+{ord(m.group()):04X}: {value!r}")
    return value


def shell(value: object) -> str:
    """One word of a POSIX shell command line, whatever the value holds."""
    return shlex.quote(str(value))


def shell_join(values: Iterable[object]) -> str:
    return " ".join(shell(v) for v in values)


def dockerfile_json(values: Iterable[str]) -> str:
    """A JSON array for an exec-form Dockerfile instruction."""
    return json.dumps([str(v) for v in values])


def dockerfile_word(value: object) -> str:
    """An ENV or LABEL key or value: literal under the Dockerfile lexer (single quotes: no `$`
    expansion, no escapes inside; a quote is written '\\'' as in POSIX shells)."""
    text = _no_control(str(value), "a Dockerfile ENV or LABEL value")
    if text and _SHELL_SAFE.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def dockerfile_comment(text: str) -> str:
    """One comment line: control characters (a newline would start an instruction) become spaces."""
    return "# " + _CONTROL.sub(" ", text)


def grub_word(value: object) -> str:
    """One word of a GRUB script: GRUB's single quotes keep everything literal, `$` included."""
    text = _no_control(str(value), "grub.cfg")
    if text and _SHELL_SAFE.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def grub_words(values: Iterable[str]) -> str:
    return " ".join(grub_word(v) for v in values)


def ipxe_word(value: object) -> str:
    """One word of an iPXE script line. iPXE splits on white space and expands `${...}` with no
    way to quote either, so a value holding them (or a control character) is refused."""
    text = _no_control(str(value), "boot.ipxe")
    if not text or re.search(r"\s|\$\{|^#", text) or text in ("&&", "||"):
        raise Unquotable(f"boot.ipxe cannot hold {text!r} as one word (white space, '${{', a leading '#', "
                         "&& or ||)")
    return text


def cmdline_args(cmdline: str) -> list[str]:
    """A kernel command line split as the kernel splits it: on white space outside double quotes."""
    return re.findall(r'(?:[^\s"]+|"[^"]*")+', cmdline)


def unit_word(value: object) -> str:
    """A value in a systemd unit (ExecStart= arguments, Environment=): C-style double quotes;
    `%` doubled (specifiers), `$` doubled (variable expansion in ExecStart)."""
    text = _no_control(str(value), "a systemd unit")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


_UNIT_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def unit_value(value: object) -> str:
    """One word of a systemd unit line: a plain word as it is (no `%`, `$`, quote, backslash or white
    space), anything else `unit_word`'s double quotes; a control character is refused."""
    text = _no_control(str(value), "a systemd unit")
    if _UNIT_SAFE.fullmatch(text):
        return text
    return unit_word(text)


def deb822_value(value: object) -> str:
    """A single-line deb822 field value (apt .sources): no newline, no leading white space."""
    return _no_control(str(value), "an apt sources field").strip()


def config_line_value(value: object) -> str:
    """The value of a `key = value` line (sysctl.d) or of an `options` line (modprobe.d): one line."""
    return _no_control(str(value), "a one-line configuration value")
