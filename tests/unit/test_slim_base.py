"""The slim base (from.debian.slim): mmdebstrap's options for it, and that leaving it at its default
moves no other image's base key."""

from __future__ import annotations

from pathlib import Path

from builder import debian
from builder.compose import compose
from builder.definitions.load import load_tree
from builder.plan import digest

ROOT = Path(__file__).resolve().parents[2]
DEB = {"suite": "bookworm", "mirror": "http://deb.debian.org/debian", "components": ["main"],
       "variant": "minbase", "include": [], "security": ""}


def test_slim_bootstrap_merges_usr_by_hook_and_excludes_docs() -> None:
    cmd = debian.mmdebstrap_command({**DEB, "slim": True}, "OUT")
    assert f"--hook-dir={debian.MERGED_USR_HOOKS}" in cmd
    rules = [o.removeprefix("--dpkgopt=") for o in cmd if o.startswith("--dpkgopt=path-")]
    assert rules == list(debian.SLIM_PATH_RULES)
    # dpkg: the last matching rule wins, so each include comes after the exclude it narrows
    assert rules.index("path-include=/usr/share/doc/*/copyright") > rules.index("path-exclude=/usr/share/doc/*")
    assert rules.index("path-include=/usr/lib/*/gconv/gconv-modules*") > rules.index("path-exclude=/usr/lib/*/gconv/*")
    assert any(o.startswith("--customize-hook=") and "dpkg.log" in o for o in cmd)
    # the options come before the positional suite, target and mirrors
    assert cmd.index("bookworm") > max(i for i, o in enumerate(cmd) if o.startswith("--"))


def test_not_slim_is_the_bootstrap_it_was() -> None:
    assert debian.slim_options(DEB) == debian.slim_options({**DEB, "slim": False}) == []
    assert debian.mmdebstrap_command(DEB, "OUT") == debian.mmdebstrap_command({**DEB, "slim": False}, "OUT")


def test_slim_false_leaves_the_base_key_of_other_images_alone() -> None:
    tree = load_tree(ROOT)
    node = compose(tree, "node-minimal")
    assert node.base.debian is not None and "slim" not in node.base.debian
    assert node.base.key == debian_key(node.base.debian, node.base.epoch)
    slim = compose(tree, "container-base")
    assert slim.base.debian is not None and slim.base.debian["slim"] is True
    assert slim.base.key != debian_key({k: v for k, v in slim.base.debian.items() if k != "slim"}, slim.base.epoch)


def debian_key(deb: dict[str, object], epoch: int) -> str:
    return digest(debian.recipe(deb, epoch))
