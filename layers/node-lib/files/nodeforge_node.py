"""What nodeforge's node programs share (gpu-health, nccl-bench, numa-probe, gpu-metrics, gpu-power).

Installed as /usr/lib/python3/dist-packages/nodeforge_node.py by the node-lib layer, so that the
node's python3 imports it as is; the standard library only, Python 3.11 (Debian 12).

- `write_atomic`: a file replaced whole (temporary file beside it, fsync, rename, fsync of the
  directory), so that a reader (the node exporter, a monitoring agent) never sees half of it and a
  crash never leaves an empty file.
- `Metrics`: the Prometheus text format for node_exporter's textfile collector, HELP and TYPE once
  per metric, label values escaped.
- `tool`, `ToolError`, `run_tool`: external tools (nvidia-smi, dcgmi, ...) by path, overridable by an
  environment variable (NODEFORGE_TOOL_NVIDIA_SMI=...) so that tests run the recorded fakes.
- `parse_csv`, `parse_csv_with_header`: nvidia-smi's --query-gpu answers as rows of
  {field: value or None} ([N/A], [Not Supported] and the like are None).
- `config_defaults`: options of an INI file's section (the program's --config) as the command
  line's defaults, so that options given on the command line win.
- `finish`: the common tail of a check: the JSON record and metrics written, the report printed,
  the exit code returned.
- `read_xid_policy`: the node's one Xid policy table (/usr/share/nodeforge/xid-policy.tsv, code ->
  action and meaning) with a site's per-action overrides; gpu-health judges Xids by it and
  nodeforge-xid-rules generates the Xid alerts from it.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

NA = frozenset({"", "N/A", "Not Supported", "Unknown Error", "Requested functionality has been deprecated"})
Row = dict[str, str | None]


class ToolError(Exception):
    """An external tool missing, timing out, exiting non-zero or answering something unreadable."""


# --- files ---------------------------------------------------------------------------------------

def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` whole. The temporary name starts with a dot and ends in .tmp, so that a
    textfile collector (which reads *.prom) never reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


# --- metrics -------------------------------------------------------------------------------------

def label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float | int | str) -> str:
    """A sample value: strings as given, integral floats without the '.0', others in full."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not (value == int(value) and abs(value) < 2**53):
        return repr(value)
    return str(int(value))


class Metrics:
    """Metric families in the order first declared, each with its HELP, TYPE and samples."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def declare(self, name: str, kind: str, help_text: str) -> None:
        self.families.setdefault(name, (kind, help_text, []))

    def add(self, name: str, kind: str, help_text: str, value: float | int | str,
            labels: Mapping[str, str] | None = None) -> None:
        self.declare(name, kind, help_text)
        self.sample(name, value, labels)

    def sample(self, name: str, value: float | int | str, labels: Mapping[str, str] | None = None) -> None:
        """A sample of a metric declared before (a family may have none)."""
        text = ",".join(f'{k}="{label_value(v)}"' for k, v in (labels or {}).items())
        self.families[name][2].append(f"{name}{{{text}}} {number(value)}" if text else f"{name} {number(value)}")

    def gauge(self, name: str, help_text: str, value: float | int | str,
              labels: Mapping[str, str] | None = None) -> None:
        self.add(name, "gauge", help_text, value, labels)

    def text(self) -> str:
        out: list[str] = []
        for name, (kind, help_text, samples) in self.families.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(out) + "\n"


# --- tools ---------------------------------------------------------------------------------------

def tool(name: str, *variables: str) -> str:
    """A tool's path: the first set of NODEFORGE_TOOL_<NAME> (upper case, '-' as '_') and the program's own
    `variables` (NVIDIA_SMI, ...), else the name (found on PATH)."""
    for variable in ("NODEFORGE_TOOL_" + re.sub(r"\W", "_", name).upper(), *variables):
        if os.environ.get(variable):
            return os.environ[variable]
    return name


def run_tool(argv: list[str], timeout: float = 60) -> str:
    """The standard output of a tool that must succeed; ToolError naming the command otherwise."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise ToolError(f"{argv[0]} not found: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise ToolError(f"{' '.join(argv)} timed out after {timeout:.0f} s") from e
    except OSError as e:
        raise ToolError(f"{' '.join(argv)}: {e}") from e
    if done.returncode != 0:
        text = (done.stdout + done.stderr).strip().replace("\n", " / ")
        raise ToolError(f"{' '.join(argv)} exited {done.returncode}: {text}")
    return done.stdout


# --- nvidia-smi ----------------------------------------------------------------------------------

def cell(text: str) -> str | None:
    """One answer cell: None for what nvidia-smi could not read ([N/A], [Not Supported], ...)."""
    text = text.strip()
    return None if text.startswith("[") or text in NA else text


def parse_csv(text: str, fields: Iterable[str], lenient: bool = False) -> list[Row]:
    """Rows of a `--format=csv,noheader[,nounits]` answer by field name. A line with another number of
    fields is a ToolError, or with `lenient` left out (nvidia-smi prints per-GPU errors among rows)."""
    names = tuple(fields)
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split(",")
        if len(values) != len(names) and lenient:
            continue
        if len(values) != len(names):
            raise ToolError(f"expected {len(names)} fields, found {len(values)}: {line!r}")
        rows.append({f: cell(v) for f, v in zip(names, values, strict=True)})
    return rows


def parse_csv_with_header(text: str, fields: tuple[str, ...]) -> tuple[list[Row], list[str]]:
    """Rows of a `--format=csv` answer by column name (units stripped from the header), and the
    lines that are not rows (nvidia-smi prints per-GPU errors among them)."""
    rows: list[Row] = []
    other: list[str] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None and cells and cells[0].split(" [")[0] == fields[0]:
            header = [re.sub(r"\s*\[[^\]]*\]$", "", c) for c in cells]
            missing = [f for f in fields if f not in header]
            if missing:
                other.append(f"answer lacks the columns {', '.join(missing)}")
            continue
        if header is not None and len(cells) == len(header):
            rows.append({name: cell(c) for name, c in zip(header, cells, strict=True)})
        else:
            other.append(line.strip())
    return rows, other


# --- the Xid policy ------------------------------------------------------------------------------

XID_POLICY = "/usr/share/nodeforge/xid-policy.tsv"
XID_ACTIONS = ("drain", "reset", "warn", "ignore")


def read_xid_policy(path: Path | str = XID_POLICY,
                    overrides: Mapping[str, Iterable[int]] | None = None) -> dict[int, tuple[str, str]]:
    """code -> (action, meaning) from the tab-separated table (code, action, meaning; '#' comments), then
    `overrides` ({action: codes}, in XID_ACTIONS order) over single rows. ValueError names the file and
    line of a malformed row or an unknown override action."""
    policy: dict[int, tuple[str, str]] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3 or not parts[0].strip().isdigit() or parts[1].strip() not in XID_ACTIONS:
            raise ValueError(f"{path}:{number}: expected 'code<TAB>action<TAB>description' with action one of "
                             f"{', '.join(XID_ACTIONS)}, found {line!r}")
        policy[int(parts[0])] = (parts[1].strip(), parts[2].strip())
    for action, codes in (overrides or {}).items():
        if action not in XID_ACTIONS:
            raise ValueError(f"unknown Xid action {action!r}: one of {', '.join(XID_ACTIONS)}")
        for code in codes:
            policy[int(code)] = (action, policy.get(int(code), (action, "set by site policy"))[1])
    return policy


# --- the tail of a check -------------------------------------------------------------------------

def finish(doc: dict[str, Any], report: Callable[[dict[str, Any]], str], *, json_out: bool,
           json_file: str | None = None, textfile: Path | None = None,
           metrics: Callable[[dict[str, Any]], str] | None = None) -> int:
    """Write the JSON record and the metrics where asked, print the JSON or the report, and return
    the record's exit_code."""
    if json_file:
        write_atomic(Path(json_file), json.dumps(doc, indent=2) + "\n")
    if textfile is not None and metrics is not None:
        write_atomic(textfile, metrics(doc))
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if json_out else report(doc))
    return int(doc["exit_code"])


# --- the command line ----------------------------------------------------------------------------

def config_defaults(p: argparse.ArgumentParser, argv: list[str], section: str, reserved: tuple[str, ...] = ()) -> None:
    """Read the file of --config and set its [section]'s option = value lines as `p`'s defaults; an
    unknown option (or one of `reserved`, the positionals) is a usage error naming the file."""
    pre, _ = p.parse_known_args(argv)
    config = configparser.ConfigParser(interpolation=None)
    if pre.config and Path(pre.config).is_file():
        config.read(pre.config, encoding="utf-8")
    if not config.has_section(section):
        return
    known = {a.dest: a for a in p._actions}
    defaults: dict[str, Any] = {}
    for key, raw in config.items(section):
        dest = key.replace("-", "_")
        if dest not in known or dest in reserved:
            p.error(f"{pre.config}: unknown option {key!r}")
        action = known[dest]
        if isinstance(action, argparse._StoreTrueAction):
            defaults[dest] = raw.strip().lower() in ("1", "yes", "true", "on")
        elif callable(action.type):
            defaults[dest] = action.type(raw)
        else:
            defaults[dest] = raw.strip() or None
    p.set_defaults(**defaults)
