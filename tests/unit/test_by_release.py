"""A parameter's default per Debian release (`by-release`): the image's release picks it, a config,
image or --set still overrides it, `plan --explain` names the release whose value applied, and a
value of the wrong type is refused at its own line."""

from __future__ import annotations

from pathlib import Path

from support.trees import nodeforge, tree_with_layers

LAYER = """\
name: libgcc-note
summary: writes the gcc-N-base of the release
applies-to: [container, node]
requires: [base]
params:
  gcc_base:
    type: str
    default: gcc-base
    by-release: {bookworm: gcc-12-base, trixie: gcc-14-base}
    doc: the package
files:
  - {path: /etc/gcc-base, content: "{{ gcc_base }}\\n"}
"""


def _image(name: str, suite: str, layers: str = "base, libgcc-note") -> str:
    return (f'name: {name}\nsummary: on {suite}\nkind: container\nversion: "1"\nfrom: {{debian: {{suite: {suite}}}}}\n'
            f"source-date-epoch: 1735689600\nlayers: [{layers}]\n"
            f"outputs: {{tags: [nodeforge/{name}:1]}}\n")


def _tree(tmp: Path, layer: str = LAYER) -> Path:
    tree = tree_with_layers(tmp, ["base"], {"on12": _image("on12", "bookworm"), "on13": _image("on13", "trixie"),
                                            "plain13": _image("plain13", "trixie", "base"),
                                            "child": 'name: child\nsummary: on on13\nkind: container\nversion: "1"\n'
                                                     "from: {image: plain13}\nlayers: [libgcc-note]\n"})
    (tree / "layers" / "libgcc-note").mkdir()
    (tree / "layers" / "libgcc-note" / "layer.yaml").write_text(layer)
    return tree


def test_the_release_picks_the_default_and_explain_names_it(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    for image, value, why in (("on12", "gcc-12-base", "default for bookworm"),
                              ("on13", "gcc-14-base", "default for trixie"),
                              ("child", "gcc-14-base", "default for trixie")):  # the release of the base below
        p = nodeforge(tree, "plan", image, "--explain")
        assert p.returncode == 0, p.stderr
        line = next(x for x in p.stdout.splitlines() if "libgcc-note.gcc_base" in x)
        assert f"= {value}" in line and why in line, line
        assert "layers/libgcc-note/layer.yaml:" in line


def test_a_release_not_listed_takes_the_default(tmp_path: Path) -> None:
    p = nodeforge(_tree(tmp_path, LAYER.replace(", trixie: gcc-14-base", "")), "plan", "on13", "--explain")
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if "libgcc-note.gcc_base" in x)
    assert "= gcc-base" in line and "<- default (layers/libgcc-note/layer.yaml:" in line, line


def test_a_set_value_still_wins_over_the_release_default(tmp_path: Path) -> None:
    p = nodeforge(_tree(tmp_path), "plan", "on13", "--explain", "--set", "libgcc-note.gcc_base=gcc-13-base")
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if "libgcc-note.gcc_base" in x)
    assert "= gcc-13-base" in line and "<- --set libgcc-note.gcc_base" in line, line


def test_a_by_release_value_of_the_wrong_type_is_refused_at_its_line(tmp_path: Path) -> None:
    bad = LAYER.replace("{bookworm: gcc-12-base, trixie: gcc-14-base}", "\n      bookworm: gcc-12-base\n"
                        "      trixie: [gcc-14-base]")
    p = nodeforge(_tree(tmp_path, bad), "validate")
    assert p.returncode == 2, p.stdout + p.stderr
    said = p.stdout + p.stderr
    assert "layers/libgcc-note/layer.yaml:11" in said and "params.gcc_base.by-release.trixie" in said, said
    assert "expected a string" in said
    p = nodeforge(_tree(tmp_path / "x", LAYER.replace("trixie: gcc-14-base", "sid: gcc-14-base")), "validate")
    assert p.returncode == 2 and "expected one of bookworm, trixie" in p.stdout + p.stderr


def test_schema_layer_lists_the_values_by_release(tmp_path: Path) -> None:
    p = nodeforge(_tree(tmp_path), "schema", "layer", "libgcc-note")
    assert p.returncode == 0, p.stderr
    assert 'on bookworm "gcc-12-base"; on trixie "gcc-14-base"' in p.stdout
