"""Named checks: every check composition runs has a fixture that makes it fire (the problem carries
its name) and the base fixture keeps every one quiet; every rootfs check of the assembler fires
on a root with the fault and stays quiet on a clean one; `validate --list-checks` lists them all,
with the layers' asserts."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.trees import NODE_IMAGE

from builder.checks import rootfs
from builder.checks.registry import CHECKS
from builder.cli import main
from builder.compose import compose
from builder.definitions.load import load_tree
from builder.errors import DefinitionError

BASE_LAYER = "name: one\nsummary: a layer\nsysctl: {vm.swappiness: 1}\n"
IMAGE = NODE_IMAGE

CUT_LAYER = "name: c\nsummary: s\ncut: /kept\n"
FULL_IMAGE = ("name: full\nsummary: s\nkind: container\nversion: '1'\nfrom: {debian: {suite: bookworm}}\n"
              "source-date-epoch: 1700000000\nlayers: [one]\n")
CUT_IMAGE = "name: cut\nsummary: s\nkind: container\nversion: '1'\nfrom: {image: full}\nlayers: [c]\n"
AS_CONTAINER_OF_FULL = {"kind: node": "kind: container", "from: {debian: {suite: bookworm}}": "from: {image: full}",
                        "source-date-epoch: 1700000000\n": ""}

# check name -> (extra layer.yaml files, or images/NAME: another image, the image's layer list,
# image text changes)
FIRE: dict[str, tuple[dict[str, str], str, dict[str, str]]] = {
    "conflict/sysctl": ({"two": "name: two\nsummary: s\nsysctl: {vm.swappiness: 60}\n"}, "one, two", {}),
    "conflict/env": ({"a": "name: a\nsummary: s\nenv: {X: '1'}\n", "b": "name: b\nsummary: s\nenv: {X: '2'}\n"},
                     "one, a, b", {}),
    "conflict/labels": ({"a": "name: a\nsummary: s\nlabels: {x: '1'}\n",
                         "b": "name: b\nsummary: s\nlabels: {x: '2'}\n"}, "one, a, b", {}),
    "conflict/files": ({"a": "name: a\nsummary: s\nfiles: [{path: /etc/x, content: a}]\n",
                        "b": "name: b\nsummary: s\nfiles: [{path: /etc/x, content: b}]\n"}, "one, a, b", {}),
    "conflict/kernel-arg": ({"a": "name: a\nsummary: s\nkernel: {args: [iommu=pt]}\n",
                             "b": "name: b\nsummary: s\nkernel: {args: [iommu=off]}\n"}, "one, a, b", {}),
    "conflict/kernel.modprobe": ({"a": "name: a\nsummary: s\nkernel: {modprobe: {nvidia: {NVreg_X: 1}}}\n",
                                  "b": "name: b\nsummary: s\nkernel: {modprobe: {nvidia: {NVreg_X: 2}}}\n"},
                                 "one, a, b", {}),
    "conflict/module": ({"a": "name: a\nsummary: s\nkernel: {modules: [nvidia], blacklist: [nvidia]}\n"}, "one, a", {}),
    "conflict/service": ({"a": "name: a\nsummary: s\nservices: {enable: [x.service], disable: [x.service]}\n"},
                         "one, a", {}),
    "rendered/grammar": ({"a": "name: a\nsummary: s\nfiles: [{path: \"{{ '/etc/../x' }}\", content: x}]\n"},
                         "one, a", {}),
    "service/unit": ({"a": "name: a\nsummary: s\nservices: {enable: [\"{{ 'not a unit' }}\"]}\n"}, "one, a", {}),
    "services/systemd": ({"a": "name: a\nsummary: s\nservices: {enable: [x.service]}\n"}, "one, a", {}),
    "kernel-arg/known": ({"a": "name: a\nsummary: s\nkernel: {args: [pcie_bus_perf]}\n"}, "one, a", {}),
    "sysctl/shape": ({"a": "name: a\nsummary: s\nsysctl: {swappiness: 1}\n"}, "one, a", {}),
    "package/name": ({"a": "name: a\nsummary: s\npackages: {apt: [\"{{ 'Bad_Name' }}\"]}\n"}, "one, a", {}),
    "test/scope": ({"a": "name: a\nsummary: s\ntests: [{name: t, scope: image, sysctl: {key: vm.x, value: 1}}]\n"},
                   "one, a", {}),
    "test/field": ({"a": "name: a\nsummary: s\ntests: [{name: t, service: {name: x.service, active: true}}]\n"},
                   "one, a", {}),
    "test/restates-contribution": ({"a": "name: a\nsummary: s\nsysctl: {vm.dirty_ratio: 10}\n"
                                          "tests: [{name: t, sysctl: {key: vm.dirty_ratio, value: 10}}]\n"},
                                    "one, a", {}),
    "layer/known": ({}, "one, nothing", {}),
    "layer/once": ({}, "one, one", {}),
    "layer/applies-to": ({"a": "name: a\nsummary: s\napplies-to: [container]\n"}, "one, a", {}),
    "layer/requires": ({"a": "name: a\nsummary: s\nrequires: [gpu-driver]\n"}, "one, a", {}),
    "layer/conflicts": ({"a": "name: a\nsummary: s\nconflicts: [one]\n"}, "one, a", {}),
    "layer/cycle": ({"a": "name: a\nsummary: s\nrequires: [b]\n", "b": "name: b\nsummary: s\nrequires: [a]\n"},
                    "one, a", {}),
    "param/known": ({}, "one", {"layers: [one]": "layers: [{one: {nope: 1}}]"}),
    "param/value": ({"a": "name: a\nsummary: s\nparams: {n: {type: int, default: 1, max: 2, doc: d}}\n"},
                    "one, a", {"layers: [one, a]": "layers: [one, {a: {n: 9}}]"}),
    "image/source-date-epoch": ({}, "one", {"source-date-epoch: 1700000000\n": ""}),
    "image/parent": ({}, "one", {"from: {debian: {suite: bookworm}}": "from: {image: nothing}"}),
    "cut/only-layer": ({"c": CUT_LAYER, "d": "name: d\nsummary: s\n", "images/full": FULL_IMAGE}, "d, c",
                       AS_CONTAINER_OF_FULL),
    "cut/container": ({"c": CUT_LAYER}, "c", {}),
    "cut/no-children": ({"c": CUT_LAYER, "images/full": FULL_IMAGE, "images/cut": CUT_IMAGE}, "one",
                        {"from: {debian: {suite: bookworm}}": "from: {image: cut}",
                         "source-date-epoch: 1700000000\n": ""}),
    "cut/no-shell": ({"c": CUT_LAYER + "tests: [{name: t, command: {run: 'true'}}]\n", "images/full": FULL_IMAGE},
                     "c", AS_CONTAINER_OF_FULL),
}


def make_tree(root: Path, layers: dict[str, str], listed: str, changes: dict[str, str]) -> Path:
    for name, text in {"one": BASE_LAYER, **layers}.items():
        if name.startswith("images/"):
            continue
        (root / "layers" / name).mkdir(parents=True)
        (root / "layers" / name / "layer.yaml").write_text(text)
    image = IMAGE.replace("LAYERS", listed)
    for old, new in changes.items():
        assert old in image
        image = image.replace(old, new)
    (root / "images").mkdir()
    (root / "images" / "img.yaml").write_text(image)
    for name, text in layers.items():
        if name.startswith("images/"):
            (root / f"{name}.yaml").write_text(text)
    (root / "configs").mkdir()
    return root


def test_the_base_fixture_keeps_every_check_quiet(tmp_path: Path) -> None:
    plan = compose(load_tree(make_tree(tmp_path, {}, "one", {})), "img")
    assert plan.sysctl["vm.swappiness"].value == "1"


def test_every_composition_check_has_a_firing_fixture() -> None:
    assert {n for n, c in CHECKS.items() if c.stage == "compose"} - set(FIRE) == set()


@pytest.mark.parametrize("name", sorted(FIRE))
def test_check_fires_with_its_name(name: str, tmp_path: Path) -> None:
    if name not in CHECKS:
        pytest.skip(f"{name} is not registered in this tree")
    layers, listed, changes = FIRE[name]
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(make_tree(tmp_path, layers, listed, changes)), "img")
    assert name in [p.lint for p in e.value.problems], e.value.render()
    assert all(p.remedy for p in e.value.problems if p.lint == name)


# a boot test that checks what the derived checks do not: another layer's value, another value, a
# different question about the key, a kernel argument the layer does not set
RESTATES_QUIET = (
    "tests: [{name: t, sysctl: {key: vm.swappiness, value: 1}}]\n",
    "sysctl: {vm.dirty_ratio: 10}\ntests: [{name: t, sysctl: {key: vm.dirty_ratio, value: 20}}]\n",
    "sysctl: {vm.dirty_ratio: 10}\ntests: [{name: t, scope: boot, command: {run: sysctl -n vm.dirty_ratio, "
    "stdout: {matches: '^1'}}}]\n",
    "kernel: {args: [iommu=pt]}\ntests: [{name: t, cmdline: {contains: [iommu=pt, quiet]}}]\n",
)
RESTATES_FIRE = (
    "sysctl: {vm.dirty_ratio: 10}\ntests: [{name: t, scope: boot, command: {run: sysctl -n vm.dirty_ratio, "
    "stdout: {equals: '10'}}}]\n",
    "kernel: {args: [iommu=pt, pcie_aspm=off]}\ntests: [{name: t, cmdline: {contains: [pcie_aspm=off]}}]\n",
    "kernel: {args: [iommu=pt]}\ntests: [{name: t, scope: boot, command: {run: grep -qw iommu=pt /proc/cmdline}}]\n",
)


@pytest.mark.parametrize("body", RESTATES_QUIET)
def test_a_boot_test_of_something_not_derived_is_not_a_restatement(body: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"a": f"name: a\nsummary: s\n{body}"}, "one, a", {})
    assert compose(load_tree(tree), "img").tests


@pytest.mark.parametrize("body", RESTATES_FIRE)
def test_a_restated_command_or_cmdline_test_fires(body: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path, {"a": f"name: a\nsummary: s\n{body}"}, "one, a", {})
    with pytest.raises(DefinitionError) as e:
        compose(load_tree(tree), "img")
    assert [p.lint for p in e.value.problems] == ["test/restates-contribution"], e.value.render()
    assert "delete the test" in e.value.problems[0].remedy


# --- rootfs checks -------------------------------------------------------------------------------

def clean_root(root: Path) -> Path:
    for rel, text in {"boot/vmlinuz-6.1.0-28-amd64": "k", "boot/initrd.img-6.1.0-28-amd64": "i",
                      "etc/machine-id": "", "etc/hosts": rootfs.HOSTS, "var/log/apt/eipp.log.xz": ""}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "etc/ssh").mkdir()
    (root / "var/lib/apt/lists").mkdir(parents=True)
    (root / "var/lib/apt/lists/lock").write_text("")
    return root


ROOTFS_FAULTS: dict[str, tuple[dict[str, str], str]] = {
    "rootfs/secret-file": ({"etc/munge/munge.key": "k"}, "fatal"),
    "rootfs/engine-leftover": ({".dockerenv": ""}, "removed"),
    "rootfs/hostname": ({"etc/hostname": "buildkitsandbox\n"}, "removed"),
    "rootfs/hosts": ({"etc/hosts": "172.17.0.2\tbuildkitsandbox\n"}, "rewritten"),
    "rootfs/machine-id": ({"etc/machine-id": "0123456789abcdef0123456789abcdef\n"}, "emptied"),
    "rootfs/resolv-conf": ({"etc/resolv.conf": ""}, "removed"),
    "rootfs/ssh-host-keys": ({"etc/ssh/ssh_host_ed25519_key": "k", "etc/ssh/ssh_host_ed25519_key.pub": "p"},
                             "removed"),
    "rootfs/private-key": ({"etc/site.key": "-----BEGIN PRIVATE KEY-----\nMIIEvQ==\n-----END PRIVATE KEY-----\n"},
                           "fatal"),
    "rootfs/package-lists": ({"var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease": "x"}, "left"),
    "rootfs/build-records": ({"var/log/dpkg.log": "install x\n", "var/cache/ldconfig/aux-cache": "c",
                              "var/lib/dkms/m/1.0/6.1.0-28-amd64/x86_64/log/make.log": "DKMS make.log\n"}, "removed"),
    "rootfs/logs": ({"var/log/nodeforge-step.log": "x\n"}, "left"),
    "rootfs/one-kernel": ({"boot/vmlinuz-6.1.0-27-amd64": "k"}, "fatal"),
    "rootfs/initrd": ({"boot/initrd.img-6.1.0-28-amd64": None}, "fatal"),  # type: ignore[dict-item]
}


def test_a_clean_root_keeps_every_rootfs_check_quiet(tmp_path: Path) -> None:
    assert rootfs.run(clean_root(tmp_path)) == []


def test_every_rootfs_check_has_a_fault_fixture() -> None:
    assert {n for n, c in CHECKS.items() if c.stage == "assemble"} == set(ROOTFS_FAULTS)


@pytest.mark.parametrize("name", sorted(ROOTFS_FAULTS))
def test_rootfs_check_reports_what_it_found(name: str, tmp_path: Path) -> None:
    root = clean_root(tmp_path)
    files, action = ROOTFS_FAULTS[name]
    for rel, text in files.items():
        if text is None:
            (root / rel).unlink()
        else:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    findings = rootfs.run(root)
    assert [(f.check.name, f.action) for f in findings] == [(name, action)]
    if action not in ("left", "fatal"):
        assert rootfs.run(root) == []  # fixed: a second run finds nothing


def test_machine_id_is_emptied_not_removed(tmp_path: Path) -> None:
    root = clean_root(tmp_path)
    (root / "etc/machine-id").write_text("abc\n")
    rootfs.run(root)
    assert (root / "etc/machine-id").read_text() == ""


# --- the listing ---------------------------------------------------------------------------------

def test_list_checks_names_every_check_with_its_remedy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layer = ("name: a\nsummary: s\nparams: {v: {type: str, default: '1', doc: d}}\n"
             "asserts:\n  - {name: v-is-one, that: \"{{ v == '1' }}\", message: v must be 1, remedy: set v to 1}\n")
    tree = make_tree(tmp_path, {"a": layer}, "one, a", {})
    assert main(["--root", str(tree), "validate", "--list-checks"]) == 0
    out = capsys.readouterr().out
    for c in CHECKS.values():
        assert f"{c.name}  ({c.stage})\n    {c.doc}\n    fix: {c.remedy}" in out
    assert "assert/v-is-one  (compose, layer a)\n    v must be 1\n    fix: set v to 1" in out


def test_list_checks_without_a_loadable_tree_still_lists_the_registry(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    tree = make_tree(tmp_path, {"a": "name: a\nsummary: [not, a, string]\n"}, "one, a", {})
    assert main(["--root", str(tree), "validate", "--list-checks"]) == 0
    captured = capsys.readouterr()
    assert all(name in captured.out for name in CHECKS) and "assert/" not in captured.out
    assert "layers/a/layer.yaml" in captured.err and "asserts are left out" in captured.err


def test_the_build_hosts_resolvers_are_removed_and_a_resolver_link_kept(tmp_path: Path) -> None:
    from builder.checks import rootfs

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/resolv.conf").write_text("nameserver 10.255.255.53\n")  # what the bootstrap copied
    found = [f for f in rootfs.run(tmp_path) if f.check.name == "rootfs/resolv-conf"]
    assert found and not (tmp_path / "etc/resolv.conf").exists()
    (tmp_path / "etc/resolv.conf").symlink_to("../run/systemd/resolve/stub-resolv.conf")
    assert not [f for f in rootfs.run(tmp_path) if f.check.name == "rootfs/resolv-conf"]
    assert (tmp_path / "etc/resolv.conf").is_symlink()
