"""The composer: DAG, parameter precedence and merge rules, provenance, conflicts, frozen plan."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from builder.checks import kargs, sysctl
from builder.compose import compose
from builder.compose.params import parse_sets
from builder.definitions.load import Tree, load_tree
from builder.errors import DefinitionError

ROOT = Path(__file__).resolve().parent.parent


def image_text(tree: Path) -> str:
    return (tree / "images/node-minimal.yaml").read_text()


def write(tree: Path, rel: str, text: str) -> None:
    p = tree / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_default_plan_has_the_corrected_kernel_args(tree: Tree) -> None:
    plan = compose(tree, "node-minimal", "default")
    args = plan.cmdline.split()
    assert "iommu=pt" in args and "pcie_aspm=off" in args
    # A1: no pci= MPS policy by default (pcie_bus_perf breaks GPUDirect P2P); never a bare pcie_bus_perf
    assert not any(a.startswith("pci=") for a in args) and "pcie_bus_perf" not in args
    assert plan.sysctl["vm.swappiness"].value == "1"


def test_precedence_default_config_image_cli(scratch_tree: Path) -> None:
    write(scratch_tree, "configs/site.yaml",
          "name: site\nsummary: s\nparams:\n  sysctl: {swappiness: 5, dirty_ratio: 20}\n")
    img = image_text(scratch_tree).replace("  - sysctl\n", "  - sysctl: {swappiness: 7}\n")
    write(scratch_tree, "images/node-minimal.yaml", img)
    t = load_tree(scratch_tree)
    plan = compose(t, "node-minimal", "site", parse_sets(["sysctl.dirty_background_ratio=3"]))
    p = plan.params
    assert p["sysctl.swappiness"].value == 7 and p["sysctl.swappiness"].source.startswith("image node-minimal")
    assert p["sysctl.dirty_ratio"].value == 20 and p["sysctl.dirty_ratio"].source.startswith("config site")
    assert p["sysctl.dirty_background_ratio"].value == 3
    assert p["sysctl.dirty_background_ratio"].source == "--set sysctl.dirty_background_ratio"
    assert p["sysctl.rmem_max"].source.startswith("default (layers/sysctl/layer.yaml:")
    plan2 = compose(t, "node-minimal", "site", parse_sets(["sysctl.swappiness=9"]))
    assert plan2.sysctl["vm.swappiness"].value == "9"


def test_lists_append_replace_and_null_resets(scratch_tree: Path) -> None:
    write(scratch_tree, "configs/site.yaml",
          "name: site\nsummary: s\nparams:\n  kernel-args: {extra: [nosmt]}\n")
    t = load_tree(scratch_tree)
    plan = compose(t, "node-minimal", "site", parse_sets(["kernel-args.extra+=[quiet]"]))
    assert plan.params["kernel-args.extra"].value == ["nosmt", "quiet"]
    assert "nosmt" in plan.cmdline.split() and "quiet" in plan.cmdline.split()
    replaced = compose(t, "node-minimal", "site", parse_sets(["kernel-args.extra=[quiet]"]))
    assert replaced.params["kernel-args.extra"].value == ["quiet"]
    assert "nosmt" not in replaced.cmdline.split()
    reset = compose(t, "node-minimal", "site", parse_sets(["kernel-args.extra=null"]))
    assert reset.params["kernel-args.extra"].value == []
    assert "nosmt" not in reset.cmdline.split()
    scalar_reset = compose(t, "node-minimal", "site", parse_sets(["sysctl.swappiness=null"]))
    assert scalar_reset.params["sysctl.swappiness"].value == 1


def test_two_layers_setting_swappiness_differently_name_both(scratch_tree: Path) -> None:
    write(scratch_tree, "layers/tuned/layer.yaml", "name: tuned\nsummary: s\nsysctl:\n  vm.swappiness: 60\n")
    img = image_text(scratch_tree).replace("  - monitoring\n", "  - monitoring\n  - tuned\n")
    write(scratch_tree, "images/node-minimal.yaml", img)
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(scratch_tree), "node-minimal", "default")
    text = e.value.render()
    assert "layer sysctl" in text and "layer tuned" in text
    assert "vm.swappiness = '1'" in text and "vm.swappiness = '60'" in text


def test_same_value_from_two_layers_is_not_a_conflict(scratch_tree: Path) -> None:
    write(scratch_tree, "layers/tuned/layer.yaml", "name: tuned\nsummary: s\nsysctl:\n  vm.swappiness: 1\n"
          "kernel: {args: [iommu=pt, module_blacklist=nvidiafb]}\n")
    img = image_text(scratch_tree).replace("  - monitoring\n", "  - monitoring\n  - tuned\n")
    write(scratch_tree, "images/node-minimal.yaml", img)
    plan = compose(load_tree(scratch_tree), "node-minimal", "default")
    assert plan.cmdline.split().count("iommu=pt") == 1
    assert "module_blacklist=nouveau,nvidiafb" in plan.cmdline.split()  # comma lists merge


def test_two_layers_writing_one_file_conflict(scratch_tree: Path) -> None:
    write(scratch_tree, "layers/tuned/layer.yaml", "name: tuned\nsummary: s\nfiles:\n"
          "  - {path: /etc/apt/apt.conf.d/90-nodeforge, content: other}\n")
    img = image_text(scratch_tree).replace("  - monitoring\n", "  - monitoring\n  - tuned\n")
    write(scratch_tree, "images/node-minimal.yaml", img)
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(scratch_tree), "node-minimal", "default")
    assert "files./etc/apt/apt.conf.d/90-nodeforge" in e.value.render()
    assert "layer base" in e.value.render() and "layer tuned" in e.value.render()


def test_a_package_phase_step_runs_in_the_package_phase(scratch_tree: Path) -> None:
    write(scratch_tree, "layers/tuned/layer.yaml", "name: tuned\nsummary: s\nsteps:\n"
          "  - {name: right after the installs, phase: packages, run: echo in-package-phase}\n"
          "  - {name: after the files, run: echo in-config-phase}\n")
    img = image_text(scratch_tree).replace("  - monitoring\n", "  - monitoring\n  - tuned\n")
    write(scratch_tree, "images/node-minimal.yaml", img)
    plan = compose(load_tree(scratch_tree), "node-minimal", "default")
    assert plan.install is not None
    install = plan.install.apply
    assert "echo in-package-phase" in install and "in-config-phase" not in install
    assert install.index("apt-get install") < install.index("echo in-package-phase")
    assert "# layer tuned: wheels, holds and package-phase steps" in install
    (tuned,) = [s for s in plan.steps if s.layer == "tuned"]
    assert "echo in-config-phase" in tuned.apply and "in-package-phase" not in tuned.apply
    before = plan.install.key
    write(scratch_tree, "layers/tuned/layer.yaml", "name: tuned\nsummary: s\nsteps:\n"
          "  - {name: right after the installs, phase: packages, run: echo in-package-phase}\n"
          "  - {name: after the files, run: echo changed}\n")
    again = compose(load_tree(scratch_tree), "node-minimal", "default")
    assert again.install is not None and again.install.key == before  # a config step leaves the packages alone


@pytest.mark.parametrize("name, whose", [("packages", "the package phase's"),
                                         ("boot-config", "the boot configuration step's")])
def test_no_layer_takes_the_name_of_a_step_nodeforge_makes(scratch_tree: Path, name: str, whose: str) -> None:
    write(scratch_tree, f"layers/{name}/layer.yaml", f"name: {name}\nsummary: s\n")
    with pytest.raises(DefinitionError) as e:
        load_tree(scratch_tree)
    text = e.value.render()
    assert f"layers/{name}/layer.yaml" in text and f"{name!r} is {whose}" in text
    assert "rename the layer and its directory" in text


def test_required_layer_is_pulled_in_and_ordered_first(scratch_tree: Path) -> None:
    img = image_text(scratch_tree).replace("  - base\n", "")
    write(scratch_tree, "images/node-minimal.yaml", img)
    plan = compose(load_tree(scratch_tree), "node-minimal", "default")
    order = [s.layer for s in plan.steps]
    assert "base" in order and order.index("base") < order.index("monitoring")


def test_plan_is_frozen_and_json_round_trips(tree: Tree) -> None:
    plan = compose(tree, "node-minimal", "default")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.image = "x"  # type: ignore[misc]
    text = json.dumps(plan.to_json())  # no default=: every value of the plan is JSON as it is
    data = json.loads(text)
    assert data["key"] == plan.key and [s["layer"] for s in data["steps"]] == [s.layer for s in plan.steps]
    assert json.dumps(json.loads(text)) == text


def test_keys_are_stable_and_change_only_from_the_changed_layer_on(scratch_tree: Path) -> None:
    a = compose(load_tree(scratch_tree), "node-minimal", "default")
    b = compose(load_tree(scratch_tree), "node-minimal", "default")
    assert [s.key for s in a.steps] == [s.key for s in b.steps]
    # a module option (a file of the layer's own step): that step and every later one
    c = compose(load_tree(scratch_tree), "node-minimal", "default", parse_sets(["kernel-args.blacklist_nouveau=false"]))
    i = [s.layer for s in a.steps].index("kernel-args")
    assert [s.key for s in a.steps][:i] == [s.key for s in c.steps][:i]
    assert all(x.key != y.key for x, y in zip(a.steps[i:], c.steps[i:], strict=True))
    # a kernel argument (the boot configuration step, after every layer): no layer step at all
    d = compose(load_tree(scratch_tree), "node-minimal", "default", parse_sets(["kernel-args.iommu=nopt"]))
    assert [s.key for s in a.steps] == [s.key for s in d.steps] and a.key != d.key


def test_explain_names_the_source_of_every_value(tree: Tree, capsys: pytest.CaptureFixture[str]) -> None:
    from builder.cli import main

    assert main(["plan", "images/node-minimal.yaml", "-c", "default", "--explain",
                 "--set", "sysctl.dirty_ratio=12"]) == 0
    out = capsys.readouterr().out
    assert "sysctl.swappiness = 1    <- config default (configs/default.yaml:" in out
    assert "sysctl.dirty_ratio = 12    <- --set sysctl.dirty_ratio" in out
    assert "iommu=pt    <- layer kernel-args (layers/kernel-args/layer.yaml:" in out


@pytest.mark.parametrize(("arg", "fragment"), [
    ("pcie_bus_perf", "use pci=pcie_bus_perf"),
    ("pcie_bus_safe", "use pci=pcie_bus_safe"),
    ("pcie_replay_count=5", "DCGM field 202"),
    ("amd_iommu=on", "intel_iommu=on"),
    ("pcie_acs_override=downstream", "setpci"),
    ("pci=noacs", "setpci"),
    ("rd.blacklist=nouveau", "rd.driver.blacklist"),
    ("iommu=fast", "known values"),
    ("quiet=1", "takes no value"),
    ("hugepages=lots", "not a valid value"),
])
def test_known_wrong_kernel_args(arg: str, fragment: str) -> None:
    problem = kargs.check(arg)
    assert problem is not None and fragment in " ".join(problem)


@pytest.mark.parametrize("arg", ["iommu=pt", "pci=pcie_bus_perf,realloc", "pcie_aspm=off", "hugepagesz=1G",
                                 "module_blacklist=nouveau", "rd.driver.blacklist=nouveau",
                                 "nvidia.NVreg_EnableStreamMemOPs=1", "console=ttyS0,115200n8", "intel_iommu=on"])
def test_good_kernel_args(arg: str) -> None:
    assert kargs.check(arg) is None


@pytest.mark.parametrize(("key", "ok"), [("vm.swappiness", True), ("net.ipv4.conf.all.rp_filter", True),
                                         ("swappiness", False), ("vm..x", False), ("foo.bar", False)])
def test_sysctl_key_shape(key: str, ok: bool) -> None:
    assert (sysctl.check_key(key) is None) is ok


def test_the_project_tree_validates(capsys: pytest.CaptureFixture[str]) -> None:
    from builder.cli import main

    assert main(["validate"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_every_schema_key_has_a_doc_and_the_readme_example_uses_schema_keys() -> None:
    import re

    from builder.definitions.spec import ListOf, MapOf, Spec, Struct
    from builder.definitions.tables import CONFIG, IMAGE, LAYER

    def walk(spec: Spec, path: str) -> list[str]:
        if isinstance(spec, Struct):
            missing = [f"{path}.{k}" for k, f in spec.fields.items() if not f.doc.strip()]
            return missing + [m for k, f in spec.fields.items() for m in walk(f.spec, f"{path}.{k}")]
        if isinstance(spec, ListOf | MapOf):
            inner = getattr(spec, "item", None) or getattr(spec, "value", None)
            return walk(inner, path) if isinstance(inner, Spec) else []
        return []

    assert walk(LAYER, "layer") + walk(IMAGE, "image") + walk(CONFIG, "config") == []
    readme = (ROOT / "README.md").read_text()
    example = readme.split("### A layer")[1].split("```yaml")[1].split("```")[0]
    keys = re.findall(r"^([a-z-]+):", example, re.M)
    assert keys and set(keys) <= set(LAYER.fields), set(keys) - set(LAYER.fields)
