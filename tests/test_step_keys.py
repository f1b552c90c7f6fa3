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
    "container-base": ("dd54c8723962e43b7eb91cf6b4c7b1eb065fb10fc4860e00e268c0012b695164",
                       "de077f29cbd753153616cc3837640bf3849397de298638c2d998fa15da0656c9"),
    "cuda-11.8-base": ("a363cc724f65ff21c1144a9519dd4dbc82666c78c2040647673d8aeeddcfc953",
                       "a6e75b01a7e9aaa61d2b87bf836eda5533ab1a76fb0475d4c69ca97da6bbff54"),
    "cuda-11.8-base-slim": ("6cda50593d60b62423ca0ecce8c4f0f757890e91ab4ecb984d2e45c60b3257b5",
                            "a439e0b2f7609635f27fefef965402f0401c336b75603a6d0788bb1f84ccc0ce"),
    "cuda-11.8-devel": ("e2131d998a4806261efcb5a658786c833c871f8f4ef146e55bb1de2352bba9fd",
                        "c852b33d5b20c4399598af587920a989e8fc8253dbd70b3e34bebb57d4fb9c5e"),
    "cuda-11.8-runtime": ("32b4842463ae594776870e09dcbe6330766415141500eba19c60ca71f750feb8",
                          "5e4ceba6803ec6be4aff7b330600f228c9a966321fa38d536281fdb0c440dda4"),
    "cuda-12.9-base": ("4b187ac9de9c99e5f694633efce5500ac362df05636beb5eab3589e06f836aa2",
                       "f3da117590b4963dcac941a2d08f37c74c5310b7ff3905a8efb2c3fc8e440556"),
    "cuda-12.9-runtime": ("7011fcf63d116268a83a2200154d4c4f3e917d4abe844113797db2ef2a2e1621",
                          "513760d90b46031cdb042583a639f1a309f6db989bb26a719a09774d67d880b9"),
    "cuda-13.0-base": ("0758e9322bdc5a7e8ee71f26bba58c1c716d5535ca287db6d32d3ede77f68456",
                       "e16e71410f50f055d204b7cac597eb7ca86008ee4474b8a92f597ab2bfc8d1cc"),
    "cuda-13.0-devel": ("27ca42c1e59e05c5db45377bf5a2319bc1250751fc156754256912cccee91779",
                        "5e7632431c1607bb15cd9ba882a6fdc9e2ed43d3c8d343fb0026f5d95e3fdb28"),
    "cuda-13.0-runtime": ("1413943fff4085727fba28772245e9f8ea951f8f93208f099820a0007d03d69d",
                          "fb31918cb7e4bf013a792701dce8b6377eeba99ce9d2f6d72522fd0ccff36558"),
    "cupy-cuda12.9": ("360710558ccdc9b08729ee5bd7bb18e39bbef316de58fd7fa6ad19a6b70a644f",
                      "271b9f251b2aa549de2a270122f1b9938443e44c4febffe3d5d5877dfd446d5c"),
    "node-minimal": ("60eede833494672594c83417e704af42ba1b4498dbeb267e91800b239fa662ba",
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
