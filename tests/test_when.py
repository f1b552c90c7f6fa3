"""`when:` on list contributions and templates in services: a layer for both image kinds enables
its unit on nodes only (nodeforge issue 14). Composition tests run without an engine; one test
builds the layer into a small container image and a small node image (a scratch copy of the tree
whose node image is node-minimal plus the layer, so every earlier layer comes from the cache)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest
from support.trees import scratch_image

from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import load_tree
from builder.errors import DefinitionError

ROOT = Path(__file__).resolve().parent.parent
UNIT = "nodeforge-timesync.service"
LAYER = f"""\
name: timesync
summary: Clock synchronisation against the site's NTP servers
description: >
  Jobs spread over many nodes need one clock. The configuration goes into every image; the unit is
  enabled on nodes only (a container takes its clock from the host).
applies-to: [node, container]
params:
  servers: {{type: "list[str]", default: [ntp1.example.org], doc: NTP servers}}
  debug: {{type: bool, default: false, doc: a kernel argument and a module for debugging}}
files:
  - path: /etc/nodeforge/timesync.conf
    content: "{{% for s in servers %}}server {{{{ s }}}} iburst\\n{{% endfor %}}"
  - path: /etc/systemd/system/{UNIT}
    when: "{{{{ image.kind == 'node' }}}}"
    content: |
      [Unit]
      Description=clock synchronisation
      [Service]
      ExecStart=/bin/true
      [Install]
      WantedBy=multi-user.target
kernel:
  args:
    - {{item: "clocksource=tsc", when: "{{{{ debug }}}}"}}
  modules:
    - {{item: ptp, when: "{{{{ debug and image.kind == 'node' }}}}"}}
services:
  enable:
    - {{item: {UNIT}, when: "{{{{ image.kind == 'node' }}}}"}}
tests:
  - name: servers configured
    file: {{path: /etc/nodeforge/timesync.conf, content: {{contains: ["server {{{{ servers[0] }}}} iburst"]}}}}
  - name: unit enabled on nodes
    when: "{{{{ image.kind == 'node' }}}}"
    service: {{name: {UNIT}, enabled: true}}
"""
CONTAINER = scratch_image("when-container", "a container with the two-kind layer", ["timesync"], kind="container",
                          version="1.0", tag="nodeforge-test/when-container:1.0")


def scratch(tmp: Path) -> Path:
    for d in ("layers", "configs"):
        shutil.copytree(ROOT / d, tmp / d)
    (tmp / "images").mkdir()
    (tmp / "layers/timesync").mkdir()
    (tmp / "layers/timesync/layer.yaml").write_text(LAYER)
    (tmp / "images/when-container.yaml").write_text(CONTAINER)
    node = (ROOT / "images/node-minimal.yaml").read_text()
    node = node.replace("name: node-minimal", "name: when-node").replace("  - monitoring\n", "  - monitoring\n"
                                                                         "  - timesync\n")
    node = node.replace("tags: [nodeforge/node-minimal:0.1.0]", "tags: [nodeforge-test/when-node:0.1.0]\n"
                        "  formats: [raw]")
    (tmp / "images/when-node.yaml").write_text(node)
    lock = (ROOT / "images/node-minimal.lock").read_text().replace("image: node-minimal", "image: when-node")
    (tmp / "images/when-node.lock").write_text(lock)
    return tmp


def units(plan: object) -> list[str]:
    return [v.value for v in plan.services_enabled]  # type: ignore[attr-defined]


def test_plan_lists_the_unit_for_the_node_only(tmp_path: Path) -> None:
    tree = load_tree(scratch(tmp_path))
    node, container = compose(tree, "when-node", "default"), compose(tree, "when-container")
    assert UNIT in units(node) and UNIT not in units(container)
    assert f"/etc/systemd/system/{UNIT}" in node.files and f"/etc/systemd/system/{UNIT}" not in container.files
    assert "/etc/nodeforge/timesync.conf" in container.files
    (step,) = [s for s in container.steps if s.layer == "timesync"]
    assert "systemctl" not in step.apply
    (step,) = [s for s in node.steps if s.layer == "timesync"]
    assert f"systemctl enable {UNIT}" in step.apply
    shown = subprocess.run([sys.executable, "-m", "builder", "--root", str(tmp_path), "plan", "when-container"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert UNIT not in shown.stdout
    shown = subprocess.run([sys.executable, "-m", "builder", "--root", str(tmp_path), "plan", "when-node", "-c",
                            "default"], capture_output=True, text=True)
    assert shown.returncode == 0 and UNIT in shown.stdout


def test_when_follows_parameters(tmp_path: Path) -> None:
    tree = load_tree(scratch(tmp_path))
    off = compose(tree, "when-node", "default")
    on = compose(tree, "when-node", "default", parse_sets(["timesync.debug=true"]))
    container_on = compose(tree, "when-container", None, parse_sets(["timesync.debug=true"]))
    assert "clocksource=tsc" not in off.cmdline.split() and "clocksource=tsc" in on.cmdline.split()
    assert "ptp" in [m.value for m in on.modules] and "ptp" not in [m.value for m in off.modules]
    assert "ptp" not in [m.value for m in container_on.modules]


def test_templated_service_items_render_and_empty_ones_drop(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    text = LAYER.replace(f"    - {{item: {UNIT}, when: \"{{{{ image.kind == 'node' }}}}\"}}",
                         f"    - \"{{{{ '{UNIT}' if image.kind == 'node' else '' }}}}\"")
    assert text != LAYER
    (root / "layers/timesync/layer.yaml").write_text(text)
    tree = load_tree(root)
    assert UNIT in units(compose(tree, "when-node", "default"))
    assert units(compose(tree, "when-container")) == []


def test_a_rendered_unit_is_checked(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    text = LAYER.replace(f"    - {{item: {UNIT}, when: \"{{{{ image.kind == 'node' }}}}\"}}",
                         "    - \"{{ 'not a unit' if image.kind == 'node' else '' }}\"")
    (root / "layers/timesync/layer.yaml").write_text(text)
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(root), "when-node", "default")
    assert "services.enable[0]" in e.value.render() and "[service/unit]" in e.value.render()


def test_a_malformed_guard_is_a_definition_error(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    text = LAYER.replace(f"{{item: {UNIT}, when:", f"{{unit: {UNIT}, when:")
    (root / "layers/timesync/layer.yaml").write_text(text)
    with pytest.raises(DefinitionError) as e:
        load_tree(root)
    assert "unknown key 'unit'" in e.value.render()


def nodeforge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, timeout=3000)


def test_two_kind_layer_builds_as_container_and_node(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    root = scratch(tmp_path / "tree")
    built = nodeforge("build", str(root / "images/when-container.yaml"), "-q")
    assert built.returncode == 0, built.stderr[-3000:]
    built = nodeforge("build", str(root / "images/when-node.yaml"), "-c", "default", "-q")
    assert built.returncode == 0, built.stderr[-3000:]
    for image in ("when-container", "when-node"):
        tested = nodeforge("test", str(root / f"images/{image}.yaml"), "--report", str(tmp_path / "reports"))
        assert tested.returncode == 0, tested.stdout + tested.stderr
    c = docker_client.containers.create("nodeforge-test/when-container:1.0", command=["/bin/true"], entrypoint=[])
    try:
        names = {m.split("/")[-1] for m in _paths(c)}
    finally:
        c.remove(force=True)
    assert "timesync.conf" in names and UNIT not in names


def _paths(container: Any) -> list[str]:
    import io
    import tarfile

    data = b"".join(container.export())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def test_services_without_systemd_are_refused_before_building(tmp_path: Path) -> None:
    root = scratch(tmp_path)
    text = LAYER.replace(f"    - {{item: {UNIT}, when: \"{{{{ image.kind == 'node' }}}}\"}}", f"    - {UNIT}")
    (root / "layers/timesync/layer.yaml").write_text(text)
    tree = load_tree(root)
    assert UNIT in units(compose(tree, "when-node", "default"))  # the node image has systemd (base layer)
    with pytest.raises(DefinitionError) as e:
        compose(tree, "when-container")
    rendered = e.value.render()
    assert "[services/systemd]" in rendered and "layers/timesync/layer.yaml" in rendered
    assert "services need systemd in the image" in rendered and "when:" in rendered
    validated = subprocess.run([sys.executable, "-m", "builder", "--root", str(root), "validate"],
                               capture_output=True, text=True)
    assert validated.returncode == 2 and "[services/systemd]" in validated.stderr
