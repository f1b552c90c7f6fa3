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
    "container-base": ("43cbbc0e7d9a4e07f1b507513b8e531273297bcc48e05cda9581ffe085767752",
                       "de077f29cbd753153616cc3837640bf3849397de298638c2d998fa15da0656c9"),
    "cuda-11.8-base": ("65b9965395303ad3a9bd35ad6830fbc173dcabf12722cf988c674784c4969991",
                       "a6e75b01a7e9aaa61d2b87bf836eda5533ab1a76fb0475d4c69ca97da6bbff54"),
    "cuda-11.8-base-slim": ("f18493c267a03237f4f682a54f36503f26fab033c5eb2dd47f99bc9619d4a0a8",
                            "a439e0b2f7609635f27fefef965402f0401c336b75603a6d0788bb1f84ccc0ce"),
    "cuda-11.8-devel": ("ee9a8d97066d10cbd8843437f23dd4afecccfde4f1e46b6eb1c9974bb3df9e9e",
                        "c852b33d5b20c4399598af587920a989e8fc8253dbd70b3e34bebb57d4fb9c5e"),
    "cuda-11.8-runtime": ("439395c85179b3a44fc3b466013202c02ff1380ade457e744fa8772d13cd2c7f",
                          "5e4ceba6803ec6be4aff7b330600f228c9a966321fa38d536281fdb0c440dda4"),
    "cuda-12.9-base": ("509d173b906c48d6a61d5e1fed3f45739eb8c6890586e4383dd2daea5e0fff6b",
                       "f3da117590b4963dcac941a2d08f37c74c5310b7ff3905a8efb2c3fc8e440556"),
    "cuda-12.9-runtime": ("a0ef8b049b13551cf8796923d09602821c32654e2711d98f3c18c0e54e15c1c2",
                          "513760d90b46031cdb042583a639f1a309f6db989bb26a719a09774d67d880b9"),
    "cuda-13.0-base": ("5c752ec591126cb1979bd43bf5b506ba25d071ca5c7e30d6c549538a97669cad",
                       "e16e71410f50f055d204b7cac597eb7ca86008ee4474b8a92f597ab2bfc8d1cc"),
    "cuda-13.0-devel": ("6255f2984753219a7bf0f9053bc9a8791ecf5ca1424d67ce844c3c4d16363799",
                        "5e7632431c1607bb15cd9ba882a6fdc9e2ed43d3c8d343fb0026f5d95e3fdb28"),
    "cuda-13.0-runtime": ("d87341466541f2a0afc62296efc8b5a5ce2a51140ccc49c4ea0e906db5906a4b",
                          "fb31918cb7e4bf013a792701dce8b6377eeba99ce9d2f6d72522fd0ccff36558"),
    "cupy-cuda12.9": ("acda6133859869ffd0fb4448e6055ac740a718dfd12c29f0280cad4d8a84262c",
                      "271b9f251b2aa549de2a270122f1b9938443e44c4febffe3d5d5877dfd446d5c"),
    "node-minimal": ("2bb7580b6b5e0acf33a4c447452352e1316e9c84844b421d805c34ffaec04f2b",
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
