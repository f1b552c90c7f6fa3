"""The one reader of JSON documents nodeforge did not just write itself: a mirror index, a build
manifest, an OCI layout's index and manifests. Each is untrusted (it travels between machines and
teams), so it is read the same way: a regular file only (a FIFO or a device would block or never
end), bounded in size, parsed as strict JSON, then checked against a schema of the spec language
(builder.definitions.spec). Any failure is a UsageError (exit 2) naming the file, the key path,
what was expected and what was found: never a traceback, never a hang."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import Collector, Problem, UsageError
from .spec import Spec, validate

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_bytes(path: Path, what: str, remedy: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, opened without blocking (a FIFO
    listed by a hostile document is refused, not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot be read ({e.strerror}); {remedy}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path}: not a regular file; {remedy}")
        if st.st_size > limit:
            raise UsageError(f"{what} {path}: {st.st_size} bytes, more than the {limit} a {what} may have; "
                             f"{remedy}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UsageError(f"{what} {path}: more than {limit} bytes; {remedy}")
    return data


def parse_json(data: bytes, path: Path, what: str, remedy: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path}: not UTF-8 text (byte {e.start}); {remedy}") from None
    except RecursionError:
        raise UsageError(f"{what} {path}: nested too deeply to be a {what}; {remedy}") from None
    except ValueError as e:
        where = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise UsageError(f"{what} {path}: not valid JSON{where}: {msg}; {remedy}") from None


def check(doc: Any, spec: Spec, path: Path | str, what: str, remedy: str) -> dict[str, Any]:
    """`doc` checked against `spec`; every problem found at once, each with its key path."""
    out = Collector()
    result = validate(spec, doc, str(path), out)
    if out.problems:
        problems = [Problem(p.file, p.line, p.path, p.message, p.remedy or remedy) for p in out.problems]
        n = len(problems)
        raise UsageError(f"{what} {path}: {n} problem{'s' if n != 1 else ''}", problems)
    return result


def read_json(path: Path, spec: Spec, what: str, remedy: str, limit: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """A JSON document of the given schema, or a UsageError that names the file and the key."""
    return check(parse_json(read_bytes(path, what, remedy, limit), path, what, remedy), spec, path, what, remedy)
