"""A refactor must not silently change what is built.

`tests/fixtures/keys-tree/` is a frozen copy of the definitions (layers, images, configs). The
content key of every image in it, composed with the default config, is recorded below, with a
digest of its merged contribution tables (values only, no provenance). A change to composition
that changes a key changes what every cache holds: it must be intended and said in the commit
that updates the table.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from builder.compose import compose
from builder.definitions.load import load_tree
from builder.plan import BuildPlan, digest

KEYS_TREE = Path(__file__).resolve().parent / "fixtures" / "keys-tree"

# image -> (plan key, digest of the merged tables)
# Every plan key moved once, on purpose, when the base key came to digest the whole bootstrap recipe
# (builder.debian.recipe: mmdebstrap's command line with its options and the dropped host files, and
# the engine import's changes ENV PATH and CMD) instead of a hand-written stand-in for it; every step
# key chains from the base key. The tables digests did not move. Every plan key moved again, once,
# when the recipe gained Debian's security archive as a second source (from.debian.security); the
# tables digests did not move. Every plan key moved again when the package phase came to remove
# apt's and dpkg's logs and their -old backups (phases.CLEAN_LINES); the tables digests did not
# move. node-minimal's plan key moved when a node's sysctl and kernel-argument files left their
# layers' steps for the boot configuration step after the initramfs (compose.phases): the plan key is
# that step's now; the container images' keys and every tables digest did not move.
EXPECTED: dict[str, tuple[str, str]] = {
    "container-base": ("b6ce56ad2902a292bec5d7c9eb293491fbe3372ddfd68fe6cf929467dd65ee2a",
                       "de077f29cbd753153616cc3837640bf3849397de298638c2d998fa15da0656c9"),
    "cuda-11.8-base": ("8084609779b276a679767171ff9711d455814635215b616e32fe5b5b66667687",
                       "a6e75b01a7e9aaa61d2b87bf836eda5533ab1a76fb0475d4c69ca97da6bbff54"),
    "cuda-11.8-base-slim": ("a70ef682a1aff8ffb0ed085d9b4116bf562c76be3ac8378de9acea600e26c879",
                            "a439e0b2f7609635f27fefef965402f0401c336b75603a6d0788bb1f84ccc0ce"),
    "cuda-11.8-devel": ("a128a2207b2f40d2b768be2290eaa0c4b14da7439049f716b4d37866d9b66be5",
                        "c852b33d5b20c4399598af587920a989e8fc8253dbd70b3e34bebb57d4fb9c5e"),
    "cuda-11.8-runtime": ("98d79fecd96cb8ec58a02e03bca218fc308164be4139a2bbe30ebb0a69ec9dbe",
                          "5e4ceba6803ec6be4aff7b330600f228c9a966321fa38d536281fdb0c440dda4"),
    "cuda-12.9-base": ("a5c1dc7f16dc24822141017a499ea1a3a4528d48e2045bed231086518cff1a29",
                       "f3da117590b4963dcac941a2d08f37c74c5310b7ff3905a8efb2c3fc8e440556"),
    "cuda-12.9-runtime": ("5bd9afee4a825d1a679ae2cf1d45e575395e0edf4f46b5885287908da3aa1add",
                          "513760d90b46031cdb042583a639f1a309f6db989bb26a719a09774d67d880b9"),
    "cuda-13.0-base": ("6e5ede67b05afe1c9e7708a4adf2f5d1014b67b5c37844a67230fa5bc1991232",
                       "e16e71410f50f055d204b7cac597eb7ca86008ee4474b8a92f597ab2bfc8d1cc"),
    "cuda-13.0-devel": ("517e30aeba5ee8390a97cd79e40df3c3f9e46de9d6af7a48700615a727252709",
                        "5e7632431c1607bb15cd9ba882a6fdc9e2ed43d3c8d343fb0026f5d95e3fdb28"),
    "cuda-13.0-runtime": ("976e60141b15f4a9ab95bca15973cc3bdd35780da84ddfc1574d9b234ca75fe0",
                          "fb31918cb7e4bf013a792701dce8b6377eeba99ce9d2f6d72522fd0ccff36558"),
    "cupy-cuda12.9": ("da176c8720e1c1c84a59bd199aeb5fce12a42091be30da2848aab48f18655f4d",
                      "271b9f251b2aa549de2a270122f1b9938443e44c4febffe3d5d5877dfd446d5c"),
    "node-minimal": ("d25d48e295e5905fbb72c0b3b5c52c0fed27c05237abe481a41c3b576b094c8e",
                     "f3c821595b49c5114807a83d9e8384c8718735f9ad4f4dc78876df3ca66235c0"),
}


def tables_digest(p: BuildPlan) -> str:
    """The merged contributions of a plan, values only (provenance wording may change freely)."""
    def values(table: dict[str, Any]) -> dict[str, Any]:
        return {k: v.value for k, v in table.items()}

    return digest({
        "sysctl": values(p.sysctl), "kernel_args": [v.value for v in p.kernel_args],
        "modules": [v.value for v in p.modules], "modprobe": values(p.modprobe),
        "blacklist": [v.value for v in p.blacklist], "enabled": [v.value for v in p.services_enabled],
        "disabled": [v.value for v in p.services_disabled], "env": values(p.env), "labels": p.labels,
        "packages": values(p.packages), "files": values(p.files), "params": values(p.params),
    })


def test_every_image_of_the_frozen_tree_is_recorded() -> None:
    tree = load_tree(KEYS_TREE)
    assert sorted(tree.images) == sorted(EXPECTED)


@pytest.mark.parametrize("image", sorted(EXPECTED))
def test_step_key_unchanged(image: str) -> None:
    plan = compose(load_tree(KEYS_TREE), image, "default")
    assert (plan.key, tables_digest(plan)) == EXPECTED[image]


def test_a_changed_definition_changes_the_key(tmp_path: Path) -> None:
    """The guard is sensitive: one sysctl default changed in a copy changes node-minimal's key."""
    copy = tmp_path / "tree"
    shutil.copytree(KEYS_TREE, copy)
    layer = copy / "layers" / "sysctl" / "layer.yaml"
    text = layer.read_text()
    assert "vm.swappiness" in text
    layer.write_text(text.replace('vm.swappiness: "{{ swappiness }}"', 'vm.swappiness: "{{ swappiness + 1 }}"'))
    assert layer.read_text() != text
    plan = compose(load_tree(copy), "node-minimal", "default")
    assert plan.key != EXPECTED["node-minimal"][0]


def test_the_base_key_digests_the_bootstrap_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to how the base is made (here one more change on the engine import) changes the keys."""
    from builder import debian

    before = compose(load_tree(KEYS_TREE), "container-base", "default")
    monkeypatch.setattr(debian, "IMPORT_CHANGES", (*debian.IMPORT_CHANGES, "ENV LANG=C.UTF-8"))
    after = compose(load_tree(KEYS_TREE), "container-base", "default")
    assert after.base.key != before.base.key and after.key != before.key
