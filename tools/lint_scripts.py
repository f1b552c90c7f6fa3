#!/usr/bin/env python3
"""shellcheck every inline script of the layers as it ships: each step's `run` and each command test's
`run`, rendered by nodeforge's own composer with the layers' default parameters.

Every layer is composed alone (with what it requires) into an image of each kind it applies to, so
that every layer is covered whether or not an image lists it. A layer whose asserts need site facts
(a GPU model, a GPU count) is composed with the first config under configs/ that satisfies them, and
the report says which. Steps and command tests both run under bash (the apply script is bash with
`set -euo pipefail`, a command test runs with `bash -c`), so shellcheck reads them as bash.

    tools/lint_scripts.py [--root DIR] [--max-lines N] [LAYER ...]

Exit 0 when shellcheck finds nothing, 1 with one line a finding, naming the layer's file, the step or
test, and the line of the script; 2 when the definitions do not compose or shellcheck is missing.
--max-lines N also reports an inline script of more than N lines of shell as written (a line holding
only template tags, `{% if %}`, is not counted): such a script belongs in the layer's files/.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from builder.compose import compose  # noqa: E402
from builder.definitions.load import Tree, load_tree  # noqa: E402
from builder.errors import DefinitionError  # noqa: E402
from builder.plan import BuildPlan  # noqa: E402

# the images whose base the probes borrow (else the first image of the kind built on Debian)
TEMPLATES = {"node": "node-minimal", "container": "container-base"}
STEP_MARK = "# step: "
JINJA_ONLY = re.compile(r"\s*(\{%-?.*?-?%\}\s*)+")  # a line of template tags only: no shell of its own
EXCLUDED = ("SC1091",)  # a sourced file is in the image (/etc/default/...), not here to follow
FINDING = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<level>\w+): (?P<message>.*)$")


@dataclasses.dataclass(frozen=True)
class Script:
    layer: str
    what: str  # "step 'name'" or "test 'name'"
    file: str  # the layer's definition, relative to the root
    line: int | None  # the line of its `run` key
    text: str
    raw_lines: int  # lines of shell as written in the definition (lines of template tags only left out)
    block: bool = False  # `run: |`: the script's line n stands at line + n (before templates expand)

    def where(self, n: int) -> str:
        at = (self.line or 0) + n if self.block and self.line else self.line or "?"
        return f"{self.file}:{at}: layer {self.layer} {self.what} (line {n} of its script)"


def probe_plan(tree: Tree, layer: str, kind: str) -> tuple[BuildPlan, str]:
    """The plan of an image holding `layer` alone (and what it requires), with the layers' defaults, or
    with the first config whose site facts its asserts accept: (plan, config used or '')."""
    base = next((tree.images[n] for n in (TEMPLATES[kind], *sorted(tree.images)) if n in tree.images
                 and tree.images[n].data["kind"] == kind and "debian" in tree.images[n].data["from"]), None)
    if base is None:
        raise LookupError(f"no image of kind {kind} built on Debian to borrow a base from")
    name = f"lint-{layer}-{kind}"
    data = {**base.data, "layers": [layer]}
    if tree.layers[layer].data.get("cut") is not None:  # a cut image is made from a full one (compose.cut)
        data["from"] = {"image": base.name}
    image = dataclasses.replace(base, name=name, data=data, layer_refs=((layer, {}, None),))
    probe = dataclasses.replace(tree, images={**tree.images, name: image})
    first: DefinitionError | None = None
    for config in (None, *sorted(tree.configs)):
        try:
            return compose(probe, name, config), config or ""
        except DefinitionError as e:
            first = first or e
    assert first is not None
    raise first


def shell_lines(raw: str) -> int:
    return sum(1 for line in raw.rstrip("\n").split("\n") if not JINJA_ONLY.fullmatch(line))


def is_block(path: Path, line: int | None) -> bool:
    """Whether the `run:` at line of path starts a block scalar (`|`, `|-`, `>`)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not line or not 0 < line <= len(lines):
        return False
    return re.search(r"run:\s*[|>][-+]?\s*$", lines[line - 1]) is not None


def step_blocks(script: str) -> Iterator[str]:
    """The steps of an apply or install script, in order: the text between `(` and `)` after each
    `# step: NAME` line (steps come last in both scripts)."""
    lines = script.rstrip("\n").split("\n")
    marks = [i for i, line in enumerate(lines) if line.startswith(STEP_MARK)] + [len(lines)]
    for start, end in itertools.pairwise(marks):
        block = lines[start + 2:end]
        while block and block[-1] != ")":
            block.pop()
        yield "\n".join(block[:-1]) + "\n"


def layer_scripts(tree: Tree, layer: str, plan: BuildPlan) -> Iterator[Script]:
    """The inline scripts of `layer` in `plan`: its steps (package phase, then config phase) and its
    command tests."""
    definition = tree.layers[layer]
    mine = [s for s in plan.steps if s.layer == layer]
    steps = definition.data["steps"]
    for phase, script in (("packages", mine[0].install if mine else ""), ("config", mine[0].apply if mine else "")):
        indexes = [i for i, s in enumerate(steps) if s.get("phase", "config") == phase]
        for i, text in zip(indexes, step_blocks(script), strict=False):
            line = definition.line("steps", i, "run")
            yield Script(layer, f"step {steps[i]['name']!r}", definition.file, line, text,
                         shell_lines(steps[i]["run"]), is_block(definition.dir / "layer.yaml", line))
    for t in (t for t in plan.tests if t.layer == layer and t.kind == "command"):
        # the definition's test: the one at the line the plan's test names
        at = [i for i, r in enumerate(definition.data["tests"])
              if r.get("command") and definition.line("tests", i) == t.line]
        line = definition.line("tests", at[0], "command", "run") if at else t.line
        raw = definition.data["tests"][at[0]]["command"]["run"] if at else t.spec["run"]
        yield Script(layer, f"test {t.name!r}", t.file, line, t.spec["run"], shell_lines(raw),
                     is_block(definition.dir / "layer.yaml", line))


def collect(tree: Tree, layers: list[str]) -> tuple[list[Script], list[str]]:
    """Every inline script of the layers (one copy of each), and notes on the configs used."""
    seen: set[tuple[str, str, str]] = set()
    scripts, notes = [], []
    for layer in layers:
        for kind in tree.layers[layer].data["applies-to"]:
            try:
                plan, config = probe_plan(tree, layer, kind)
            except LookupError as e:
                notes.append(f"layer {layer} ({kind}): not rendered: {e}")
                continue
            if config:
                notes.append(f"layer {layer} ({kind}): rendered with config {config} (its asserts need site facts)")
            for s in layer_scripts(tree, layer, plan):
                if (s.layer, s.what, s.text) not in seen:
                    seen.add((s.layer, s.what, s.text))
                    scripts.append(s)
    return scripts, notes


def shellcheck(scripts: list[Script]) -> list[str]:
    """One line a shellcheck finding, at the script's place in its layer."""
    if not scripts:
        return []
    with tempfile.TemporaryDirectory(prefix="nodeforge-lint-") as d:
        paths = []
        for i, s in enumerate(scripts):
            path = Path(d) / f"{i}.sh"
            path.write_text(s.text)
            paths.append(str(path))
        proc = subprocess.run(["shellcheck", "-s", "bash", "-f", "gcc", "-e", ",".join(EXCLUDED), *paths],
                              capture_output=True, text=True)
    findings = []
    for line in proc.stdout.splitlines():
        m = FINDING.match(line)
        if m:
            s = scripts[int(Path(m["file"]).stem)]
            findings.append(f"{s.where(int(m['line']))}: {m['level']}: {m['message']}")
        elif line.strip():
            findings.append(line)
    if proc.returncode not in (0, 1) and not findings:
        findings.append(f"shellcheck failed: {proc.stderr.strip()}")
    return findings


def too_long(scripts: list[Script], limit: int) -> list[str]:
    return [f"{s.where(1)}: the script has {s.raw_lines} lines (more than {limit}): move it to the layer's files/"
            for s in scripts if s.raw_lines > limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the project tree (default: this one)")
    parser.add_argument("--max-lines", type=int, default=None, help="also report inline scripts longer than this")
    parser.add_argument("layers", nargs="*", help="only these layers (default: every layer)")
    args = parser.parse_args(argv)
    if shutil.which("shellcheck") is None:
        print("error: shellcheck is not installed (apt-get install shellcheck)", file=sys.stderr)
        return 2
    try:
        tree = load_tree(args.root)
        unknown = sorted(set(args.layers) - set(tree.layers))
        if unknown:
            print(f"error: no layer named {', '.join(unknown)} (layers: {', '.join(sorted(tree.layers))})",
                  file=sys.stderr)
            return 2
        scripts, notes = collect(tree, args.layers or sorted(tree.layers))
    except DefinitionError as e:
        print(e.render(), file=sys.stderr)
        return 2
    findings = shellcheck(scripts) + (too_long(scripts, args.max_lines) if args.max_lines else [])
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(findings) if findings else f"ok: {len(scripts)} inline scripts, shellcheck finds nothing")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
