"""Issue 28, item 6: one layer's parameters documented (`schema layer NAME`), "did you mean" for a
mistyped name, where an assert's values were set, and a file conflict's two contents as a diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.compose.params import Override, resolve_params, where_set
from builder.compose.textdiff import short_diff
from builder.definitions import reference
from builder.definitions.load import known, load_tree
from builder.errors import Collector, DefinitionError, UsageError

KEYS_TREE = Path(__file__).resolve().parents[1] / "fixtures" / "keys-tree"


def test_schema_layer_lists_types_bounds_defaults_and_docs() -> None:
    text = reference.layer(load_tree(KEYS_TREE), "sysctl").splitlines()
    assert text[0].startswith("layer sysctl (layers/sysctl/layer.yaml): Kernel tunables")
    i = next(k for k, line in enumerate(text) if line.lstrip().startswith("swappiness "))
    assert text[i].split() == ["swappiness", "int", "0..200,", "default", "1"]
    assert text[i + 1].strip() == "vm.swappiness - how eagerly the kernel swaps"
    assert any('default "4096 87380 16777216"; pattern [0-9]+ [0-9]+ [0-9]+' in line for line in text)
    assert "--set sysctl.<param>=value" in text[-1]


def test_schema_layer_of_an_unknown_name_says_did_you_mean() -> None:
    with pytest.raises(UsageError, match=r"no layer named 'sysctll'; did you mean sysctl\? layers: app-user, "):
        reference.layer(load_tree(KEYS_TREE), "sysctll")


def test_known_names_the_closest_then_all() -> None:
    assert known("layers", "kernal", ["kernel", "base"]) == "did you mean kernel? layers: base, kernel"
    assert known("images", "zzz", ["a", "b"]) == "images: a, b"
    with pytest.raises(DefinitionError) as e:
        load_tree(KEYS_TREE).image("node-minimall")
    assert "did you mean node-minimal?" in e.value.problems[0].remedy


def test_where_set_names_each_value_an_assert_reads_and_its_line() -> None:
    tree = load_tree(KEYS_TREE)
    image = tree.image("node-minimal")
    config = tree.config("default")
    out = Collector()
    settings = resolve_params(tree, ("sysctl", "kernel-args"), image, config, [Override("sysctl", "dirty_ratio", 50)],
                              out)
    assert not out.problems
    where = where_set("swappiness <= dirty_ratio and params.sysctl.numa_balancing == 0", "sysctl", settings)
    parts = where.split("; ")
    assert parts[0].startswith("swappiness = 1 (config default (configs/default.yaml:")
    assert parts[1] == "dirty_ratio = 50 (--set sysctl.dirty_ratio)"
    assert parts[2].startswith("numa_balancing = 0 (default (layers/sysctl/layer.yaml:")
    assert where_set("true", "sysctl", settings) == ""


def test_short_diff_of_two_contents_on_one_line() -> None:
    assert short_diff("x = 1\ny = 2\n", "x = 1\ny = 3\n") == "line 2: 'y = 2' -> 'y = 3'"
    assert short_diff("a\nb\nc\n", "a\nc\nd\n") == "line 2: 'b' removed; line 4: 'd' added"
    many = short_diff("".join(f"{i}\n" for i in range(20)), "".join(f"{i}\n" if i % 4 else "x\n" for i in range(20)))
    assert many.endswith("; 2 more") and many.count("->") == 3
    assert short_diff(b"\x00\x01", "hi") == "not text: 2 bytes vs 2 bytes"
    assert "\n" not in short_diff("a\nb\n", "a\n\x1b[2Jb\n")
