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
# key chains from the base key. The tables digests did not move.
EXPECTED: dict[str, tuple[str, str]] = {
    "container-base": ("363c3d3842621af8902d6c561b51000ae5b4edba43fd02ffb3b49797991b5082",
                       "de077f29cbd753153616cc3837640bf3849397de298638c2d998fa15da0656c9"),
    "cuda-11.8-base": ("e3bef2a601eddf5645540c338982024a5ae44db8311c72341e07b19ad7933895",
                       "a6e75b01a7e9aaa61d2b87bf836eda5533ab1a76fb0475d4c69ca97da6bbff54"),
    "cuda-11.8-base-slim": ("09af860e00702269fa1f76a30985d59fc62c72c433afa9eb0dfd4f7c5952ebaf",
                            "a439e0b2f7609635f27fefef965402f0401c336b75603a6d0788bb1f84ccc0ce"),
    "cuda-11.8-devel": ("6584c2f270d32c2319e0cfda40d877260ef2047446f7a5c89bb13cbe49b2c2b3",
                        "c852b33d5b20c4399598af587920a989e8fc8253dbd70b3e34bebb57d4fb9c5e"),
    "cuda-11.8-runtime": ("671e06974012cd798205951a3331cc5e34dee7fad835e80cd333f875a0a85928",
                          "5e4ceba6803ec6be4aff7b330600f228c9a966321fa38d536281fdb0c440dda4"),
    "cuda-12.9-base": ("6f3900025f5989fc88afc71d3d886ebba0aa65f99b6428f1391515a5cf4d9cde",
                       "f3da117590b4963dcac941a2d08f37c74c5310b7ff3905a8efb2c3fc8e440556"),
    "cuda-12.9-runtime": ("1c04d4fb9e5805162aa369b9100d1427ad62b96c4ea70999eb9bb332fd8ddf6c",
                          "513760d90b46031cdb042583a639f1a309f6db989bb26a719a09774d67d880b9"),
    "cuda-13.0-base": ("dc0c02dcc618e68ff8881adcde43cff73e957dce926b1e795e8de2cf592960d1",
                       "e16e71410f50f055d204b7cac597eb7ca86008ee4474b8a92f597ab2bfc8d1cc"),
    "cuda-13.0-devel": ("203a65a486235e93cdda5423044e49d7d435a81ca9fc15ae51ffdc3283b6443c",
                        "5e7632431c1607bb15cd9ba882a6fdc9e2ed43d3c8d343fb0026f5d95e3fdb28"),
    "cuda-13.0-runtime": ("8e7956bcee144548f45422ca730b658f5fa486b7d572bb841cf8d51ab23cbb51",
                          "fb31918cb7e4bf013a792701dce8b6377eeba99ce9d2f6d72522fd0ccff36558"),
    "cupy-cuda12.9": ("c890f637740a554116e9042e207c374f09e38411dbdf45b1e74b897f063e0f08",
                      "271b9f251b2aa549de2a270122f1b9938443e44c4febffe3d5d5877dfd446d5c"),
    "node-minimal": ("dec9495deabf93d9ed5a45aed51c191eeffeef46c668d8503b5b4da7cc1b8d1d",
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
