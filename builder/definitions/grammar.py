"""What each definition string may contain, by where it goes. Definitions are untrusted input: a
value that reaches a shell script, a Dockerfile, a systemd unit, a sysctl or modprobe.d file,
GRUB, iPXE, an apt source or pip must fit the grammar of that destination. No string holds a
control character; most hold no white space and no shell metacharacter at all.

A grammar marked `template=True` may be a Jinja2 template: its literal text (outside `{{ }}` and
`{% %}`) is checked against the grammar's characters when the definition is read, and the
composer checks the rendered value with `Str.problem()` (see `check_rendered`). Writers quote
every value for their language anyway (builder.quoting): validation is not the only defence."""

from __future__ import annotations

from typing import Any

from .spec import Str
from .strings import Address, Host, ImagePath, Mode, Regex, RelPath, Url

# one line of free text: summaries, test and step names, messages (no control characters)
LINE = Str(what="a single line of text")
# free text over several lines: descriptions, inline file content, shell of steps and commands
TEXT = Str(what="text", multiline=True, template=True)
LINE_TEMPLATE = Str(what="a single line of text", template=True)

NAME = Str(r"[a-z0-9][a-z0-9.+_-]*", "a name of lower-case letters, digits, '.', '+', '_' or '-'", max_len=128)
IDENT = Str(r"[a-z_][a-z0-9_]*", "an identifier (lower-case letters, digits, '_')", max_len=128)
USER = Str(r"[a-z_][a-z0-9_-]{0,31}", "a user name (lower-case letters, digits, '_', '-'; at most 32)")
GROUP = Str(r"[a-z_][a-z0-9_-]{0,31}", "a group name (lower-case letters, digits, '_', '-'; at most 32)")
OWNER = Str(r"[a-z_][a-z0-9_-]{0,31}|[0-9]{1,10}", "a user or group name, or a numeric id")
SHELL = ImagePath(r"/[A-Za-z0-9._+/-]*", "a login shell: an absolute path such as /bin/bash")
PATH = ImagePath()
PATH_TEMPLATE = ImagePath(template=True, chars=r"[A-Za-z0-9._+@%:,=~/-]")
SOURCE = RelPath()
MODE = Mode()
REGEX = Regex()
VERSION = Str(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}", "a version such as 1.2.3 (letters, digits, . _ + ~ -)")
ENV_NAME = Str(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name", max_len=256)
LABEL_KEY = Str(r"[a-z0-9][a-z0-9._/-]*", "a label key such as org.example.name", max_len=256)
MODULE = Str(r"[a-z0-9_-]{1,64}", "a kernel module name", template=True, chars=r"[a-z0-9_-]")
MODULE_OPTION = Str(r"[A-Za-z0-9_]{1,128}", "an option name")
# modprobe.d splits options on white space and a line is a command: no space, quote, backslash or
# '#' unquoted; a double-quoted value may hold spaces (the kernel's own parser takes them)
MODULE_OPTION_VALUE = Str(r'[!$-&(-\[\]-~]+|"[ !#-\[\]-~]*"',
                          "a module option value (printable, no white space, quotes or backslash; or one "
                          "double-quoted string)", template=True, chars=r'[!-~ ]', max_len=1024)
UNIT = Str(r"[A-Za-z0-9@._:-]+\.(service|socket|timer|path|target|mount)",
           "a systemd unit name with its suffix", max_len=256)
UNIT_TEMPLATE = Str(UNIT.pattern, UNIT.what, template=True, chars=r"[A-Za-z0-9@._:-]", max_len=256)
# a kernel argument as the kernel parses it: name[=value], the value unquoted without white space
# and shell or GRUB metacharacters, or one double-quoted string
KARG = Str(r'[A-Za-z0-9_.-]+(=([A-Za-z0-9_.,:=/+@%~-]*|"[A-Za-z0-9_.,:=/+@%~ -]*"))?',
           "a kernel argument name[=value] (no white space, quotes only around the whole value, no ; $ ` "
           "or backslash)", template=True, chars=r'[A-Za-z0-9_.,:=/+@%~"-]', max_len=4096)
# /etc/sysctl.d: the key as /proc/sys shows it (dots or slashes), an optional leading '-'
SYSCTL_KEY = Str(r"-?[A-Za-z0-9_*][A-Za-z0-9_.*/:@+-]*", "a sysctl key such as vm.swappiness", max_len=256)
# the rest of the line is the value: one line, no control characters
SYSCTL_VALUE = Str(r"[ -~]*", "a sysctl value (one line of printable ASCII)", template=True, chars=r"[ -~]",
                   max_len=4096)
PKG = Str(r"[a-z0-9][a-z0-9+.-]+", "a Debian package name", template=True, chars=r"[a-z0-9+.-]", max_len=128)
# PEP 508 name, extras and version specifiers only: never an option (-i, --extra-index-url), a URL
# or a file
PIP = Str(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*\])?"
          r"((~=|===|==|!=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+(,(~=|===|==|!=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+)*)?",
          "a pip requirement specifier such as name==1.2.* (no options, URLs or spaces)", template=True,
          chars=r"[A-Za-z0-9._\[\],~=!<>*+-]", max_len=256)
URI = Str(r"https?://[A-Za-z0-9._~:/?\[\]@!&()*+,;=%-]+", "an http(s) URI", max_len=2048)
SUITE = Str(r"[A-Za-z0-9._/-]+", "an apt suite such as bookworm or /", max_len=128)
COMPONENT = Str(r"[A-Za-z0-9._-]+", "an apt component such as main", max_len=128)
TAG = Str(r"[a-z0-9][a-z0-9._/:-]*", "an image reference such as nodeforge/x:1", max_len=256)
REGISTRY = Str(r"[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?", "host[:port][/path]", max_len=256)
CACHE_REPOSITORY = Str(r"[a-z0-9.-]+(:[0-9]+)?/[a-z0-9]+(?:[._/-][a-z0-9]+)*", "host[:port]/repository",
                       max_len=200)
DIGEST = Str(r"[0-9a-f]{64}", "64 hex digits")
HOST = Host()
ADDRESS = Address()
URL = Url()
URL_OR_FILE = Url(what="an http(s) URL or a file: URL of an absolute path", file=True)
# the parameter types that are strings with a grammar (a layer's `params.X.type`); an empty value is
# allowed only where the parameter's default is empty (it means "not set")
PARAM_TYPES: dict[str, Str] = {"path": PATH, "host": HOST, "address": ADDRESS, "url": URL,
                               "url-or-file": URL_OR_FILE}
# 0 .. 2^32-1: cpio (the initramfs), tar and ext4 all hold the time in 32 bits
EPOCH_MAX = (1 << 32) - 1


def check_rendered(grammar: Str, value: str) -> str:
    """'' when a rendered template value fits its grammar, else what is wrong: the composer's
    handlers call this on every rendered value before it is written anywhere."""
    return grammar.problem(value)


def rendered_problems(grammar: Str, values: list[Any]) -> list[tuple[int, str]]:
    """(index, what is wrong) for each rendered list item that does not fit its grammar."""
    out = []
    for i, value in enumerate(values):
        why = grammar.problem(value) if isinstance(value, str) else f"expected {grammar.what}, found {value!r}"
        if why:
            out.append((i, why))
    return out
