"""The table of contribution kinds is the one place a kind is declared: every kind reads a key of
the layer schema, fills a BuildPlan field of its own, and shows in `plan --explain` and
`nodeforge diff` as its entry says; a child image inherits every merged table of its parent."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from builder.compose import compose
from builder.compose.contributions import KINDS
from builder.compose.explain import explain
from builder.definitions.load import load_tree
from builder.definitions.spec import Spec, Struct
from builder.definitions.tables import LAYER
from builder.plan import BuildPlan

KEYS_TREE = Path(__file__).resolve().parent.parent / "fixtures" / "keys-tree"
# BuildPlan fields that are not contributions of layers
NOT_CONTRIBUTIONS = {"format", "image", "kind", "version", "summary", "config", "base", "steps", "tags", "params",
                     "tests", "outputs", "inherited_layers", "user", "sets", "install",
                     "boot"}


def test_every_kind_reads_a_key_of_the_layer_schema() -> None:
    for kind in KINDS:
        spec: Spec = LAYER
        for part in kind.key.split("."):
            assert isinstance(spec, Struct) and part in spec.fields, kind.key
            spec = spec.fields[part].spec


def test_every_contribution_field_of_the_plan_has_exactly_one_kind() -> None:
    fields = [k.field for k in KINDS if k.field]
    assert len(fields) == len(set(fields))
    plan_fields = {f.name for f in dataclasses.fields(BuildPlan)} - NOT_CONTRIBUTIONS
    assert set(fields) == plan_fields


def test_explain_has_a_section_per_kind_that_asks_for_one() -> None:
    plan = compose(load_tree(KEYS_TREE), "node-minimal", "default")
    text = explain(plan)
    for kind in KINDS:
        if kind.explain and kind.field and getattr(plan, kind.field):
            assert f"  {kind.explain}:\n" in text, kind.key


def test_a_child_image_inherits_every_merged_table() -> None:
    tree = load_tree(KEYS_TREE)
    parent, child = compose(tree, "cuda-12.9-base", "default"), compose(tree, "cuda-12.9-runtime", "default")
    for kind in KINDS:
        if not kind.field:
            continue
        have, had = getattr(child, kind.field), getattr(parent, kind.field)
        if isinstance(had, dict):
            assert set(had) <= set(have), kind.key
        else:
            assert {v.value for v in had} <= {v.value for v in have}, kind.key
