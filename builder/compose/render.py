"""Jinja2 rendering with StrictUndefined: every string contribution of a layer is a template.

Layer definitions are untrusted input (they travel between teams), so templates run in Jinja2's
immutable sandbox: no attribute starting with an underscore (the way from a string to Python's
`os` module), no method that changes a value, only the filters the layers use, `include` only of
files inside the layer's `files/` (symlinks resolved), and bounds on the template's size, its
output and its running time. A template that breaks a bound is a definition error like any other.

Escaping belongs to the destination: every `{{ }}` output is escaped for the language the text is
written into (`destination`): a step's or a command test's `run` and a sourced file (/etc/default,
a sh/bash script) are shell, a systemd unit is a unit, and so on (`file_destination`); other files
are plain. The `raw` filter is the reviewed exception; `words` writes a list as several escaped
words. Macros and `{% set %}` blocks are template text: their output is not escaped twice."""

from __future__ import annotations

import contextvars
import math
import operator
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import jinja2
import jinja2.sandbox

from ..definitions import quoting
from ..errors import Collector

# a list item that is exactly "{{ expr }}" and evaluates to a list is spliced into the list
_WHOLE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")

MAX_TEMPLATE_CHARS = 256 * 1024  # one template's text: inline strings and files under files/
MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # what one template may produce
MAX_SECONDS = 5.0  # wall-clock budget of one template (a timer in the main thread, a line trace in others)
MAX_SEQUENCE = 1 << 20  # a string or list built by `*` or `+`
MAX_POWER_BITS = 4096  # the size of a number built by `**`

# exactly the filters the project's layers, images and configs use; `nodeforge validate` reports
# any other filter as unknown ("No filter named ...")
FILTERS = ("default", "first", "int", "join", "length", "list", "lower", "map", "reject", "replace",
           "string", "tojson")
GLOBALS = ("range", "namespace", "dict")

# where rendered text goes, and how a `{{ }}` value is escaped there
PLAIN, SHELL, UNIT, GRUB, IPXE = "plain", "shell", "unit", "grub", "ipxe"
ESCAPERS: dict[str, Callable[[object], object]] = {
    PLAIN: lambda value: value,
    SHELL: quoting.shell,  # bash scripts, and files a shell sources (also systemd's EnvironmentFile= syntax)
    UNIT: quoting.unit_value,
    GRUB: quoting.grub_word,
    IPXE: quoting.ipxe_word,
}
_DESTINATION: contextvars.ContextVar[str] = contextvars.ContextVar("nodeforge_destination", default=PLAIN)
# files a shell sources, by directory; scripts are known by name (*.sh) or by their shebang
SHELL_SOURCED = ("/etc/default/", "/etc/initramfs-tools/conf.d/", "/etc/profile.d/")
UNIT_DIRS = ("/etc/systemd/", "/lib/systemd/", "/usr/lib/systemd/", "/run/systemd/")
UNIT_SUFFIXES = (".service", ".socket", ".timer", ".path", ".target", ".mount", ".automount", ".swap", ".slice",
                 ".network", ".netdev", ".link")
# a unit's drop-in directory (foo.service.d/); other files under /etc/systemd/ (timesyncd.conf.d/,
# system.conf.d/) are read by their daemon's own parser, which takes quotes literally: plain
_DROP_IN_DIRS = tuple(suffix + ".d" for suffix in UNIT_SUFFIXES)
_SHELL_SHEBANG = re.compile(r"#!\s*(/usr)?/bin/(env\s+)?(ba|da)?sh\b")
# a key path of a rendered tree whose text is shell: a command test's `run`
_SHELL_KEYS = (".command.run",)


class Raw(str):
    """Text that is written as it is: template text (a macro's or `{% set %}` block's output), or a value
    passed through the `raw` filter (each use of which is reviewed: tests list them)."""


@contextmanager
def destination(kind: str) -> Iterator[None]:
    """Render the templates of this block for a destination kind (PLAIN, SHELL, UNIT, GRUB, IPXE)."""
    if kind not in ESCAPERS:
        raise ValueError(f"unknown destination {kind!r}")
    token = _DESTINATION.set(kind)
    try:
        yield
    finally:
        _DESTINATION.reset(token)


def file_destination(path: str, head: str = "") -> str:
    """The destination kind of a file written at `path` in the image whose template starts with `head`."""
    name = path.rsplit("/", 1)[-1]
    if _SHELL_SHEBANG.match(head) or name.endswith(".sh") or path.startswith(SHELL_SOURCED):
        return SHELL
    folder = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    if name.endswith(UNIT_SUFFIXES) or (path.startswith(UNIT_DIRS) and folder.endswith(_DROP_IN_DIRS)):
        return UNIT
    if name.endswith(".ipxe"):
        return IPXE
    if name == "grub.cfg" or path.startswith("/boot/grub/"):
        return GRUB
    return PLAIN


def template_head(env: jinja2.Environment, name: str) -> str:
    """The first line of a template file under files/ ('' when it cannot be read: rendering says why)."""
    try:
        assert env.loader is not None
        return env.loader.get_source(env, name)[0].partition("\n")[0]
    except Exception:  # rendering the file reports the same problem where it belongs
        return ""


def escape(value: object) -> object:
    """A value as the current destination writes it (Raw as it is)."""
    if isinstance(value, Raw):
        return value
    return ESCAPERS[_DESTINATION.get()](value)


@jinja2.pass_context  # never applied at compile time: one compiled template serves every destination
def _finalize(context: jinja2.runtime.Context, value: object) -> object:
    return escape(value)


def _raw(value: object) -> Raw:
    """`{{ v | raw }}`: the value written unescaped. Reviewed: tests/test_hardening_escaping.py lists every use."""
    return Raw(str(value))


def _words(values: Iterable[object] | str) -> Raw:
    """`{{ list | words }}`: each item one word escaped for the destination, separated by spaces."""
    items = [values] if isinstance(values, str) else list(values)
    return Raw(" ".join(str(escape(v)) for v in items))


def _concat(parts: Iterable[str]) -> Raw:
    """Macro and `{% set %}` block output: template text whose values are already escaped."""
    return Raw("".join(parts))


class TemplateBound(Exception):
    """A template ran past one of the bounds above."""


class SafeLoader(jinja2.BaseLoader):
    """Templates under one directory only: no `..`, no absolute names, and a symlink that leads
    outside the directory is refused (its target is not read)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get_source(self, environment: jinja2.Environment, template: str
                   ) -> tuple[str, str | None, Callable[[], bool] | None]:
        pieces = jinja2.loaders.split_template_path(template)  # refuses ".."
        root = self.root.resolve()
        path = root.joinpath(*pieces)
        real = path.resolve()
        if not real.is_relative_to(root):
            raise jinja2.TemplateNotFound(f"{template} (leads outside the layer's files/ directory)")
        if not real.is_file():
            raise jinja2.TemplateNotFound(template)
        if real.stat().st_size > MAX_TEMPLATE_CHARS * 4:
            raise TemplateBound(f"files/{template} is larger than {MAX_TEMPLATE_CHARS * 4} bytes")
        text = real.read_text(encoding="utf-8")
        if len(text) > MAX_TEMPLATE_CHARS:
            raise TemplateBound(f"files/{template} is longer than {MAX_TEMPLATE_CHARS} characters")
        mtime = real.stat().st_mtime
        return text, str(real), lambda: real.exists() and real.stat().st_mtime == mtime


def _bounded_binop(name: str, left: Any, right: Any) -> Any:
    if name == "**":
        if isinstance(left, int | float) and isinstance(right, int | float):
            size = abs(float(right)) * math.log2(abs(float(left)) + 2)
            if size > MAX_POWER_BITS:
                raise TemplateBound(f"{left!r} ** {right!r} is too large a number")
        return operator.pow(left, right)
    if name == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                raise TemplateBound(f"a sequence of {len(seq) * n} items is too long")
        return operator.mul(left, right)
    if name == "+":
        if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple) \
                and len(left) + len(right) > MAX_SEQUENCE:
            raise TemplateBound("a sequence is too long")
        return operator.add(left, right)
    raise AssertionError(name)


class Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, with bounded arithmetic on sizes."""

    intercepted_binops = frozenset(("**", "*", "+"))

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        return _bounded_binop(operator, left, right)


def environment(files_dir: Path) -> jinja2.Environment:
    env = Sandbox(
        loader=SafeLoader(files_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )
    env.concat = _concat  # type: ignore[method-assign]
    env.filters = {name: env.filters[name] for name in FILTERS}
    env.filters.update(raw=_raw, words=_words)
    env.globals = {name: env.globals[name] for name in GLOBALS}
    return env


class _Deadline:
    """Raises TemplateBound inside a template's own code once its time is up. In the main thread
    a real-time timer (SIGALRM) interrupts it, costing nothing while it runs; in other threads
    (parallel builds) a trace function sees every line the compiled template runs (loops, macros,
    recursion). Under a debugger or a coverage tracer there, the other bounds still hold."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.mode = ""
        self.previous: Any = None
        self.previous_timer: tuple[float, float] = (0.0, 0.0)

    def _expired(self) -> TemplateBound:
        return TemplateBound(f"the template ran longer than {self.seconds:g} s")

    def _alarm(self, signum: int, frame: FrameType | None) -> None:
        raise self._expired()

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > self.end:
            raise self._expired()
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_globals.get("environment") is not None \
                and frame.f_code.co_filename.startswith(("<template>", "/")):
            return self._local(frame, event, arg)
        return None

    def __enter__(self) -> _Deadline:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGALRM, self._alarm)
            self.previous_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self.mode = "signal"
        elif sys.gettrace() is None:
            sys.settrace(self._global)
            self.mode = "trace"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mode == "signal":
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
            delay, interval = self.previous_timer
            if delay > 0:  # an outer timer (an alarm of the caller) keeps running, less the time spent here
                signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - self.start), 0.001), interval)
        elif self.mode == "trace":
            sys.settrace(None)


def _run(render: Iterator[str]) -> str:
    parts: list[str] = []
    size = 0
    for chunk in render:
        size += len(chunk)
        if size > MAX_OUTPUT_CHARS:
            raise TemplateBound(f"the template's output is longer than {MAX_OUTPUT_CHARS} characters")
        parts.append(chunk)
    return "".join(parts)


def _explain(e: BaseException) -> str:
    if isinstance(e, jinja2.UndefinedError):
        return f"template uses an undefined name: {e.message}"
    if isinstance(e, jinja2.sandbox.SecurityError):
        return f"template refused by the sandbox: {e}"
    if isinstance(e, jinja2.TemplateSyntaxError):
        return f"template syntax error: {e.message}"
    if isinstance(e, TemplateBound):
        return f"template refused: {e}"
    if isinstance(e, quoting.Unquotable):
        return f"a value cannot be written into this {_DESTINATION.get()} text: {e}"
    if isinstance(e, RecursionError):
        return "template refused: it recurses too deeply"
    return f"template failed: {e}"


def render_string(env: jinja2.Environment, text: str, context: dict[str, Any], out: Collector,
                  file: str, line: int | None, path: str) -> str | None:
    if "{{" not in text and "{%" not in text:
        return text
    try:
        if len(text) > MAX_TEMPLATE_CHARS:
            raise TemplateBound(f"the template is longer than {MAX_TEMPLATE_CHARS} characters")
        with _Deadline(MAX_SECONDS):
            template = env.from_string(text)
            return _run(template.generate(context))
    except Exception as e:  # jinja raises many kinds; all are a user's template problem
        out.add(file, line, path, _explain(e), "parameters in scope: " + ", ".join(sorted(context)))
        return None


def render_file(env: jinja2.Environment, name: str, context: dict[str, Any], out: Collector,
                file: str, line: int | None, path: str) -> str | None:
    try:
        with _Deadline(MAX_SECONDS):
            template = env.get_template(name)
            return _run(template.generate(context))
    except Exception as e:
        where = getattr(e, "lineno", None)
        extra = f" (files/{name} line {where})" if where else f" (files/{name})"
        out.add(file, line, path, _explain(e) + extra, "parameters in scope: " + ", ".join(sorted(context)))
        return None


def render_tree(env: jinja2.Environment, value: Any, context: dict[str, Any], out: Collector, file: str,
                line: int | None, path: str) -> Any:
    """Render every string in a nested structure; list items that render empty are dropped."""
    if isinstance(value, str):
        if path.endswith(_SHELL_KEYS):
            with destination(SHELL):
                return render_string(env, value, context, out, file, line, path)
        return render_string(env, value, context, out, file, line, path)
    if isinstance(value, list):
        items: list[Any] = []
        for i, v in enumerate(value):
            m = _WHOLE.fullmatch(v) if isinstance(v, str) else None
            if m:
                try:
                    with _Deadline(MAX_SECONDS):
                        spliced = env.compile_expression(m.group(1), undefined_to_none=False)(**context)
                except Exception as e:
                    out.add(file, line, f"{path}[{i}]", _explain(e),
                            "parameters in scope: " + ", ".join(sorted(context)))
                    continue
                if isinstance(spliced, list | tuple):
                    items.extend(str(x) for x in spliced)
                    continue
            r = render_tree(env, v, context, out, file, line, f"{path}[{i}]")
            if r is None or (isinstance(r, str) and r.strip() == ""):
                continue
            items.append(r.strip() if isinstance(r, str) else r)
        return items
    if isinstance(value, dict):
        return {k: render_tree(env, v, context, out, file, line, f"{path}.{k}") for k, v in value.items()}
    return value
