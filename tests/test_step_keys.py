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
EXPECTED: dict[str, tuple[str, str]] = {
    "container-base": ("43e89926ca01f32c2142f59058ba737c416ace38d91fcedcd262d0fdcb82feee",
                       "de077f29cbd753153616cc3837640bf3849397de298638c2d998fa15da0656c9"),
    "cuda-11.8-base": ("35b07ab85a2cf1144d8b5db01373d9e6a8618e5602a928c1a219d67cea3c3edc",
                       "a6e75b01a7e9aaa61d2b87bf836eda5533ab1a76fb0475d4c69ca97da6bbff54"),
    "cuda-11.8-base-slim": ("b5591d0a0d41691876c6df6555b085b60fa09ea52e0955e9c6f7ce99c49e70b5",
                            "a439e0b2f7609635f27fefef965402f0401c336b75603a6d0788bb1f84ccc0ce"),
    "cuda-11.8-devel": ("5a865268bc3803c48a712cb80d8f7140fc8efd7f586946dd3fba704b953ac71d",
                        "c852b33d5b20c4399598af587920a989e8fc8253dbd70b3e34bebb57d4fb9c5e"),
    "cuda-11.8-runtime": ("b0b523d1e2a1c996022b0def5ade649dd96a385d22d285c0bdb83520867752ea",
                          "5e4ceba6803ec6be4aff7b330600f228c9a966321fa38d536281fdb0c440dda4"),
    "cuda-12.9-base": ("d9839a6123933a2ca5b7d10ed90e9f4bab6aa414034e961f0db2c29215b92e4e",
                       "f3da117590b4963dcac941a2d08f37c74c5310b7ff3905a8efb2c3fc8e440556"),
    "cuda-12.9-runtime": ("529daf29e32e76557eaf35a492a60d9db8acea592e04bc8c9465f94512731707",
                          "513760d90b46031cdb042583a639f1a309f6db989bb26a719a09774d67d880b9"),
    "cuda-13.0-base": ("86c1a863e89c96d2a4f0a5f302976137bd613598bb83651a28cf1a91f9af22e3",
                       "e16e71410f50f055d204b7cac597eb7ca86008ee4474b8a92f597ab2bfc8d1cc"),
    "cuda-13.0-devel": ("4ca6bb5d22a43d76ee07100d44c51d00a262c15886fb57180e2e5815d8d5f386",
                        "5e7632431c1607bb15cd9ba882a6fdc9e2ed43d3c8d343fb0026f5d95e3fdb28"),
    "cuda-13.0-runtime": ("9a966aaf271ea7ea6c048bcf450e8a6a28b7ea3a07aa337cbf2e8bba0d4248b1",
                          "fb31918cb7e4bf013a792701dce8b6377eeba99ce9d2f6d72522fd0ccff36558"),
    "cupy-cuda12.9": ("b2b8b32727a732af49fe25289ea46eef4c509b7ed9eff47488e89f5cb3c5a936",
                      "271b9f251b2aa549de2a270122f1b9938443e44c4febffe3d5d5877dfd446d5c"),
    "node-minimal": ("fbde2a1ee80c54c6db0f418ba4e7bc872d1eac53f4593e3943a9ac381024feab",
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
