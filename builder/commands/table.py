"""Every command, declared once: its name, help and README text, its arguments (drawn from the shared
definitions below), what it needs (the project tree, the engine, a built image) and its runner, a
"module:function" imported only when the command runs. builder/cli.py builds the parser from COMMANDS;
the README's command list is generated from it (readme_block)."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..plan import FORMATS

# what a command needs; BUILT: the plan of each named image as it was built (engine.recorded.built_plan),
# met once by the Invocation before the runner runs
TREE, ENGINE, BUILT = "tree", "engine", "built image"


@dataclass(frozen=True)
class Arg:
    """One argument: argparse's flags and options, and how the README's synopsis shows it."""

    flags: tuple[str, ...]
    synopsis: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(*self.flags, **self.options)


def arg(*flags: str, synopsis: str, **options: Any) -> Arg:
    return Arg(flags, synopsis, options)


IMAGE = arg("image", synopsis="IMAGE")
IMAGES = arg("images", nargs="+", synopsis="IMAGE...")
DIR = arg("dir", synopsis="DIR")
CONFIG = arg("--config", "-c", default=None, help="configs/<name>.yaml (name or path)", synopsis="[-c CONFIG]")
SET = arg("--set", "-s", action="append", metavar="LAYER.PARAM=VALUE",
          help="override a parameter (highest precedence); repeatable", synopsis="[--set L.P=V]")
QUIET = arg("-q", "--quiet", action="store_true", synopsis="[-q]")
COMPOSED = (CONFIG, SET)  # the flags that compose a plan


def flag(name: str, help: str, synopsis: str = "") -> Arg:
    """A --name switch."""
    return arg(name, action="store_true", help=help, synopsis=synopsis or f"[{name}]")


@dataclass(frozen=True)
class Command:
    name: str  # "build"; a sub-verb is "export packer"
    help: str  # one line, for --help
    group: str  # the runner module's theme: definitions, build, verify, ship, compare
    runner: str  # "module:function", imported when the command runs; takes an Invocation, returns the exit code
    args: tuple[Arg, ...] = ()
    needs: frozenset[str] = frozenset()
    doc: str = ""  # the README's text (default: help)
    synopsis: str = ""  # the README's synopsis when the arguments' own would mislead


PARENTS = {"export": "write the image's build for another builder",
           "import": "copy an OCI layout into a registry by digest (skopeo)"}

_R = "builder.commands."
COMMANDS: tuple[Command, ...] = (
    Command("validate", "check every layer, image and config", "definitions", _R + "definitions:validate",
            (CONFIG, flag("--list-checks", "list every named check (and each layer's asserts) with its doc and "
                                    "remedy")),
            frozenset({TREE}), doc="check every layer, image and config (schema and semantics, and what a build "
            "would refuse); --list-checks prints every named check"),
    Command("plan", "show what an image will contain", "definitions", _R + "definitions:plan",
            (IMAGE, *COMPOSED, flag("--explain", "say which layer, config or flag set every value"),
             flag("--json", "print the frozen build plan as JSON")), frozenset({TREE}),
            doc="what the image will contain; --explain adds where each value came from",
            synopsis="IMAGE [-c CONFIG] [--set L.P=V] [--explain | --json]"),
    Command("render", "write a build context (Dockerfile and files) to DIR", "definitions",
            _R + "definitions:render", (IMAGE, DIR, *COMPOSED), frozenset({TREE}),
            doc="a build context (Dockerfile, per-layer files, bootstrap.sh, plan.json) that plain `docker build` "
            "builds too"),
    Command("build", "build images (and the images they build on)", "build", _R + "building:build", (
        IMAGES, *COMPOSED,
        arg("-j", "--jobs", type=int, default=1, help="independent images built at once", synopsis="[-j N]"),
        flag("--locked", "fail if package resolution would change the lock"), QUIET,
        arg("--secret", action="append", metavar="NAME=PATH", synopsis="[--secret NAME=PATH]", help="a secret read "
            "in place, never copied into the image: module-signing=PEM with the key and certificate that sign DKMS "
            "modules; cache-signing=PEM with the Ed25519 key that signs what this build pushes to --cache"),
        arg("--format", default=None, metavar="FORMATS", synopsis="[--format FORMATS]", help="node outputs for this "
            f"build only, e.g. {FORMATS[0]} or {','.join(FORMATS[1:])} (overrides outputs.formats)"),
        flag("--offline", "build with no network access at all, from --mirror", synopsis="[--offline --mirror DIR]"),
        arg("--mirror", default=None, metavar="DIR", synopsis="", help="a directory made by `nodeforge "
            "mirror`, checked against its index before anything is used"),
        arg("--cache", default=None, metavar="REGISTRY/REPO", synopsis="[--cache REGISTRY/REPO]",
            help="the fleet cache (default: the config's site.cache, else none): a key missing here is pulled from "
            "it, verified; what is built is pushed and signed (with --secret cache-signing=PEM)"),
        arg("--cache-public-key", default=None, metavar="PEM", synopsis="[--cache-public-key PEM]",
            help="the Ed25519 public key a pulled entry's signature must verify against (without it nothing is "
            "pulled)"),
        flag("--cache-required", "a fleet cache that cannot be reached or answers errors fails the build "
             "(default: a warning, the build goes on locally)")), frozenset({TREE, ENGINE}),
            doc="build images and the images they build on; independent ones in parallel; writes "
            "nothing tracked: what the lock does not pin is resolved into build/resolved/ and `nodeforge "
            "lock` says how to commit it; -q: no progress lines; --secret "
            "module-signing=PEM: the key that signs DKMS modules (Secure Boot), never copied; --format "
            f"{','.join(FORMATS)}: the node outputs of this build only (a quick loop), instead of the image's "
            "outputs.formats; --offline --mirror DIR: no network, everything from a mirror; --cache REGISTRY/REPO "
            "(or the config's site.cache): keyed images shared through a registry, pulled only when their signature "
            "verifies against --cache-public-key, pushed and signed with --secret cache-signing=PEM; a registry "
            "fault is a warning unless --cache-required"),
    Command("mirror", "the locked packages, wheels and bases of images in DIR, for offline builds", "build",
            _R + "build:mirror", (arg("images", nargs="+", metavar="IMAGE... DIR", synopsis="IMAGE... DIR"),
                                  *COMPOSED, QUIET), frozenset({TREE, ENGINE}),
            doc="the locked packages, wheels and bases of images into DIR with a checksum index, for "
            "`build --offline`"),
    Command("gc", "remove step-cache entries no output tag builds on, tagged longer ago than --older-than", "build",
            _R + "build:gc", (
                arg("--older-than", default="7d", metavar="AGE", synopsis="[--older-than AGE]",
                    help="only entries tagged longer ago than this: 30m, 12h, 7d (default), 0s"),
                flag("--all-namespaces", "every nodeforge-cache* and nodeforge-base* repository (default: this "
                     "NODEFORGE_CACHE_NAMESPACE's)"),
                flag("--dry-run", "list what would go; remove nothing")),
            frozenset({ENGINE}), doc="trim the engine's step cache: untag the step and base entries tagged longer "
            "ago than AGE (default 7d) that no output tag (an image tagged outside nodeforge's cache repositories) "
            "is or builds on, and prune untagged nodeforge images; prints each entry and the space freed; "
            "--dry-run: only list; --all-namespaces: the namespaced caches of benchmarks and reproducibility "
            "checks too"),
    Command("matrix", "the variants of images × configs as JSON, deduplicated, with the step keys they share",
            "definitions", _R + "definitions:matrix", (
                IMAGES, arg("--config", "-c", dest="configs", action="append", metavar="CONFIG",
                            synopsis="[-c CONFIG...]", help="a config to build each image with (repeatable; "
                            "default: no config and every config of the tree)"), SET,
                arg("--submit", choices=["slurm"], default=None, synopsis="[--submit slurm]",
                    help="run the variants as Slurm batch jobs, each shared step key built once (its first "
                    "variant first, the others after it)"),
                arg("--sbatch-arg", action="append", metavar="--OPTION=VALUE", synopsis="[--sbatch-arg=--OPT=V...]",
                    help="an sbatch option for every job (repeatable), e.g. --sbatch-arg=--partition=build")),
            frozenset({TREE}), doc="the variants of IMAGE... with each -c CONFIG (default: no config and every "
            "config of the tree) as JSON for a CI matrix or a job array: image, config, sets, plan key, tags and "
            "the build command of each, deduplicated by plan key and tags (a config that leaves the image as it "
            "is folds into `same_as`), and the step keys more than one variant builds; `--submit slurm` submits "
            "one batch job per variant (`jobs` in the JSON), a variant waiting with `afterok` for the first "
            "variant that builds a key it shares"),
    Command("lock", "resolve every package to an exact version into images/<name>.lock", "build", _R + "build:lock",
            (arg("image", nargs="?", default=None, synopsis="IMAGE | --all"), *COMPOSED,
             arg("--all", action="store_true", synopsis="", help="every image with no config and with each config "
                 "of the tree: one lock file per (image, config) pair that owns one"),
             flag("--check", "exit 1 with a diff if the lock is not current")),
            frozenset({TREE, ENGINE}), doc="resolve every package to an exact version into images/<name>.lock "
            "(images/<name>@<config>.lock when the config changes the image); --all: every lock file the tree's "
            "(image, config) pairs own; --check: exit 1 when it is not current, listing each changed package with "
            "its old and new version and whether the new one comes from a security archive"),
    Command("test", "run an image's tests; JUnit XML and JSON reports", "verify", _R + "verify:test", (
        IMAGE, *COMPOSED, arg("--report", default="build/reports", help="directory for the reports",
                              synopsis="[--report DIR]"),
        flag("--boot", "also boot node images and run boot-scope tests"),
        arg("--boot-modes", default=None, metavar="MODES", synopsis="[--boot-modes direct,uefi,bios,netboot]",
            help="comma-separated: direct,uefi,bios,netboot (default: the three disk modes; implies --boot)")),
            frozenset({TREE, ENGINE, BUILT}), doc="run the image's tests; JUnit XML and JSON in DIR (build/reports); "
            "--boot also boots node images and runs the boot-scope tests"),
    Command("boot", "boot a node image's disk with the serial console on this terminal", "verify",
            _R + "verify:boot", (
                IMAGE, *COMPOSED, arg("--mode", choices=["direct", "uefi", "bios"], default="uefi",
                                      help="how the disk boots", synopsis="[--mode direct|uefi|bios]"),
                arg("--append", default="", help="extra kernel arguments (direct mode)", synopsis="[--append ARGS]")),
            frozenset({TREE, ENGINE, BUILT}), doc="boot a node disk with the serial console attached"),
    Command("export packer", "a Packer template (qemu builder) reproducing the node build", "ship",
            _R + "ship:export_packer", (IMAGE, DIR, *COMPOSED), frozenset({TREE, ENGINE, BUILT})),
    Command("export oci", "a normalised OCI image layout (reproducible digest); prints the digest", "ship",
            _R + "ship:export_oci", (IMAGE, DIR, *COMPOSED), frozenset({TREE, ENGINE, BUILT}),
            doc="the built image as a normalised OCI layout; prints its reproducible digest"),
    Command("import oci", "an OCI layout written by `nodeforge export oci`", "ship", _R + "ship:import_oci", (
        DIR, arg("--registry", "-r", default=None, help="HOST[:PORT] (TLS is not verified for 127.0.0.1)",
                 synopsis="--registry H:P"),
        arg("--repository", default=None, help="repository in the registry (default: the exported name)",
            synopsis="[--repository NAME]")), doc="copy an OCI layout into a registry by digest (skopeo)"),
    Command("repro", "build an image twice in isolation and compare (exit 0 identical, 1 different)", "compare",
            _R + "compare:repro", (
                IMAGE, *COMPOSED, flag("--keep", "keep both builds, their OCI layouts and namespaced engine tags"),
                flag("--no-diffoscope", "the built-in comparison even where diffoscope is installed")),
            frozenset({TREE, ENGINE}), doc="build twice in isolation and compare (exit 0 identical, 1 different)"),
    Command("push", "push every tag of built images to an OCI registry; prints digests", "ship", _R + "ship:push", (
        IMAGES, *COMPOSED, arg("--registry", "-r", default=None, synopsis="[--registry H:P]",
                               help="HOST[:PORT][/PATH] (default: the config's site.registry)")),
            frozenset({TREE, ENGINE, BUILT}), doc="push every tag of built images (default registry: the config's "
            "site.registry); prints digests"),
    Command("diff", "what changed between two built images or two rollout manifests (*.json: no engine needed); "
            "exit 1 when they differ", "compare", _R + "compare:diff", (
                arg("a", help="image tag or id, or a manifest.json", synopsis="A"),
                arg("b", nargs="?", default=None, help="image tag or id, or a manifest.json", synopsis="B"),
                flag("--previous", "A is an image: its last build's manifest against the one before it (kept "
                     "in build/images/<image>/history/)", synopsis="| A --previous [-c CONFIG]"),
                CONFIG, SET,
                flag("--all", "list every changed file"),
                arg("--format", choices=("text", "markdown"), default="text", help="markdown: for a review",
                    synopsis="[--format text|markdown]")),
            doc="what changed between two built images: packages, sysctl, kernel arguments, module options, "
            "services, env, labels, files (exit 1 if any); or between two rollout manifests (A.json B.json, no "
            "engine needed); --previous: an image's last build against the build before it (layers with their "
            "keys, parameters and where they were set, files with their changed lines); markdown: a summary for a "
            "change review",
            synopsis="A B | IMAGE --previous [-c CONFIG] [--set L.P=V] [--all] [--format text|markdown]"),
    Command("schema", "print the reference of every definition key", "definitions", _R + "definitions:schema", (
        arg("kind", nargs="?", choices=["layer", "image", "config", "param"], synopsis="[layer|image|config|param]",
            help="one definition (param: a layer parameter's keys, types and how values combine)"),
        arg("name", nargs="?", default=None, metavar="LAYER", synopsis="[LAYER]",
            help="with `layer`: that layer's parameters with their types, defaults and docs")),
            doc="the reference of every definition key; param: parameter keys and types; layer NAME: one layer's "
            "parameters with their types, defaults and docs"),
)

_TEXT_COLUMN, _WIDTH = 43, 107


def synopsis(cmd: Command) -> list[str]:
    """The README's synopsis of the command's arguments, one item per argument."""
    return [cmd.synopsis] if cmd.synopsis else [a.synopsis for a in cmd.args if a.synopsis]


def _lines(head: str, items: list[str], width: int) -> list[str]:
    """items after head, wrapped between items (never inside one) under the first item."""
    lines = [head.rstrip()]
    for item in items:
        if len(lines[-1]) + 1 + len(item) > width and lines[-1].strip():
            lines.append(" " * len(head) + item)
        else:
            lines[-1] += " " + item
    return lines


def readme_block(commands: tuple[Command, ...] = COMMANDS) -> str:
    """The README's command list: per command its synopsis (wrapped under the command) and its text."""
    out = []
    for cmd in commands:
        out += _lines(f"nodeforge {cmd.name} ", synopsis(cmd), _WIDTH + 9)
        out += textwrap.wrap(cmd.doc or cmd.help, _WIDTH, initial_indent=" " * _TEXT_COLUMN,
                             subsequent_indent=" " * _TEXT_COLUMN, break_on_hyphens=False, break_long_words=False)
    return "\n".join(out) + "\n"
