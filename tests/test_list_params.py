"""List parameters: an item type checked on every source (default, config, image, --set), `=` replaces
and `+=` appends on the command line, a plain YAML list appends and `{replace: [..]}` replaces in a
config or an image, and type errors that show the syntax that works. Composition only: no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.compose import compose
from builder.compose.params import Append, format_sets, parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError, NodeforgeError

LAYER = """\
name: timesync
summary: Time synchronisation with chrony
params:
  servers: {type: "list[str]", default: [ntp1.example.org, ntp2.example.org], doc: NTP servers}
  ports: {type: list, items: int, default: [123], min: 1, max: 65535, doc: ports}
  anything: {type: list, default: [], doc: untyped list of scalars}
files:
  - path: /etc/chrony/sources.d/site.sources
    content: |
      {% for s in servers %}server {{ s }} iburst
      {% endfor %}
"""
IMAGE = """\
name: tiny
summary: a container
kind: container
from:
  debian: {suite: bookworm}
source-date-epoch: 1735689600
layers:
  - timesync{params}
"""


def tree_with(tmp: Path, layer: str = LAYER, image_params: str = "", config: str | None = None) -> Path:
    (tmp / "layers/timesync").mkdir(parents=True, exist_ok=True)
    (tmp / "layers/timesync/layer.yaml").write_text(layer)
    (tmp / "images").mkdir(exist_ok=True)
    (tmp / "images/tiny.yaml").write_text(IMAGE.replace("{params}", image_params))
    (tmp / "configs").mkdir(exist_ok=True)
    if config is not None:
        (tmp / "configs/site.yaml").write_text("name: site\nsummary: s\nparams:\n  timesync: " + config + "\n")
    return tmp


def servers(root: Path, *sets: str, config: str | None = None) -> list[str]:
    plan = compose(load_tree(root), "tiny", config, parse_sets(list(sets)))
    value: list[str] = plan.params["timesync.servers"].value
    return value


def test_set_replaces_and_plus_equals_appends(tmp_path: Path) -> None:
    root = tree_with(tmp_path)
    assert servers(root) == ["ntp1.example.org", "ntp2.example.org"]
    assert servers(root, "timesync.servers=[a.org, b.org]") == ["a.org", "b.org"]
    assert servers(root, "timesync.servers+=[c.org]") == ["ntp1.example.org", "ntp2.example.org", "c.org"]
    assert servers(root, "timesync.servers+=c.org") == ["ntp1.example.org", "ntp2.example.org", "c.org"]
    assert servers(root, "timesync.servers=[a.org]", "timesync.servers+=[b.org]") == ["a.org", "b.org"]
    assert servers(root, "timesync.servers=null") == []
    plan = compose(load_tree(root), "tiny", None, parse_sets(["timesync.servers=[a.org, b.org]"]))
    (content,) = [f.content for s in plan.steps for f in s.files if f.path.endswith("site.sources")]
    assert content is not None
    assert [line for line in content.splitlines() if line] == ["server a.org iburst", "server b.org iburst"]


def test_yaml_list_appends_and_replace_form_replaces(tmp_path: Path) -> None:
    root = tree_with(tmp_path, config="{servers: [c.org]}")
    assert servers(root, config="site") == ["ntp1.example.org", "ntp2.example.org", "c.org"]
    root = tree_with(tmp_path, config="{servers: {replace: [c.org]}}")
    assert servers(root, config="site") == ["c.org"]
    root = tree_with(tmp_path, image_params=": {servers: {replace: [i.org]}}", config="{servers: [c.org]}")
    assert servers(root, config="site") == ["i.org"]  # the image replaces what the config appended
    root = tree_with(tmp_path, image_params=": {servers: [i.org]}")
    assert servers(root, "timesync.servers+=[s.org]") == ["ntp1.example.org", "ntp2.example.org", "i.org", "s.org"]


def test_wrong_item_type_is_a_definition_error_on_every_source(tmp_path: Path) -> None:
    bad_default = LAYER.replace("default: [123]", "default: [123, {a: b}]")
    with pytest.raises(DefinitionError) as e:
        load_tree(tree_with(tmp_path, layer=bad_default))
    assert "params.ports.default" in e.value.render() and "item 1" in e.value.render()
    untyped_map = LAYER.replace("default: [], doc: untyped", "default: [1, {a: b}], doc: untyped")
    with pytest.raises(DefinitionError) as e:
        load_tree(tree_with(tmp_path, layer=untyped_map))
    assert "expected a scalar" in e.value.render()
    root = tree_with(tmp_path, layer=LAYER, config="{ports: [80, http]}")
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "tiny", "site")
    text = e.value.render()
    assert "configs/site.yaml" in text and "item 1: expected an integer" in text and "{replace: [a, b]}" in text
    root = tree_with(tmp_path, image_params=": {ports: [70000]}")
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "tiny")
    assert "item 0: expected a value <= 65535" in e.value.render()
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "tiny", None, parse_sets(["timesync.servers=[[a]]"]))
    assert "item 0: expected a string" in e.value.render()


def test_type_errors_show_the_syntax_that_works(tmp_path: Path) -> None:
    root = tree_with(tmp_path)
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "tiny", None, parse_sets(["timesync.servers=a.org"]))
    text = e.value.render()
    assert "expected a list of str items such as [a, b], found string 'a.org'" in text
    assert "--set timesync.servers=[a,b] replaces the list" in text and "+=[c] (or +=c) appends" in text
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "tiny", None, parse_sets(["timesync.nope+=[1]"]))
    assert "has no parameter 'nope'" in e.value.render()
    scalar = LAYER.replace("params:\n", "params:\n  level: {type: int, default: 1, doc: a scalar}\n")
    root = tree_with(tmp_path, layer=scalar)
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "tiny", None, parse_sets(["timesync.level+=2"]))
    assert "+= appends to a list" in e.value.render()
    with pytest.raises(NodeforgeError) as e2:
        parse_sets(["timesync.servers+="])
    assert "+= appends items to a list" in str(e2.value)


def test_items_needs_a_list_type(tmp_path: Path) -> None:
    bad = LAYER.replace("anything: {type: list,", "anything: {type: str, items: str,")
    with pytest.raises(DefinitionError) as e:
        load_tree(tree_with(tmp_path, layer=bad.replace("default: [], doc: untyped", "default: x, doc: untyped")))
    assert "items is the item type of a list" in e.value.render()


def test_format_sets_parses_back() -> None:
    sets = parse_sets(["a.b=[x, 'y z']", "a.c+=q", "a.d=3", "a.e=", "a.f=null"])
    assert sets[1] == ("a", "c", Append(("q",)))
    assert parse_sets(list(format_sets(sets))) == sets
