"""Kernel command-line arguments: a table of the parameters nodeforge knows, and the
widely copied wrong ones with the right form named (Documentation/admin-guide/kernel-parameters.txt)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownParam:
    values: tuple[str, ...] | None = None  # None: any value; () : a flag that takes no value
    pattern: str | None = None  # regular expression for free-form values
    multi: bool = False  # comma-separated list: values from several layers are merged
    repeat: bool = False  # may be given several times (console=tty0 console=ttyS0): each value kept


_FLAG = ()
_NUM = r"[0-9]+"
_SIZE = r"[0-9]+[KMGkmg]?"

KNOWN: dict[str, KnownParam] = {
    # PCIe and IOMMU
    "pcie_aspm": KnownParam(("off", "force")),
    "pcie_ports": KnownParam(("auto", "native", "compat", "dpc-native")),
    "pci": KnownParam(("off", "conf1", "conf2", "nommconf", "nomsi", "noaer", "realloc", "realloc=on",
                       "realloc=off", "pcie_bus_tune_off", "pcie_bus_safe", "pcie_bus_perf",
                       "pcie_bus_peer2peer", "nocrs", "use_crs", "noari", "pcie_scan_all", "assign-busses",
                       "nobios", "nobar", "hpiosize", "big_root_window", "norom"), multi=True),
    "iommu": KnownParam(("off", "force", "noforce", "biomerge", "panic", "nopanic", "merge", "nomerge",
                         "soft", "pt", "nopt", "forcesac", "allowdac", "nodac", "usedac", "calgary")),
    "intel_iommu": KnownParam(("on", "off", "igfx_off", "forcedac", "strict", "sm_on", "sm_off",
                               "tboot_noforce"), multi=True),
    "amd_iommu": KnownParam(("fullflush", "off", "force_isolation", "force_enable", "pgtbl_v1", "pgtbl_v2",
                             "irtcachedis", "nohugepages", "v2_pgsizes_only"), multi=True),
    "iommu.passthrough": KnownParam(("0", "1")),
    "iommu.strict": KnownParam(("0", "1")),
    # memory
    "hugepagesz": KnownParam(pattern=_SIZE),
    "hugepages": KnownParam(pattern=_NUM),
    "default_hugepagesz": KnownParam(pattern=_SIZE),
    "transparent_hugepage": KnownParam(("always", "madvise", "never")),
    "numa_balancing": KnownParam(("enable", "disable")),
    "mem_encrypt": KnownParam(("on", "off")),
    "init_on_alloc": KnownParam(("0", "1")),
    # modules
    "module_blacklist": KnownParam(pattern=r"[a-z0-9_,-]+", multi=True),
    "modprobe.blacklist": KnownParam(pattern=r"[a-z0-9_,-]+", multi=True),
    "rd.driver.blacklist": KnownParam(pattern=r"[a-z0-9_,-]+", multi=True),
    "rd.driver.pre": KnownParam(pattern=r"[a-z0-9_,-]+", multi=True),
    "nouveau.modeset": KnownParam(("0", "1")),
    # CPU and scheduling
    "isolcpus": KnownParam(pattern=r"[0-9a-z_,-]+"),
    "nohz_full": KnownParam(pattern=r"[0-9,-]+"),
    "rcu_nocbs": KnownParam(pattern=r"[0-9,-]+"),
    "irqaffinity": KnownParam(pattern=r"[0-9,-]+"),
    "processor.max_cstate": KnownParam(pattern=_NUM),
    "intel_idle.max_cstate": KnownParam(pattern=_NUM),
    "intel_pstate": KnownParam(("disable", "passive", "active", "no_hwp", "hwp_only", "force")),
    "amd_pstate": KnownParam(("disable", "passive", "active", "guided")),
    "idle": KnownParam(("poll", "halt", "nomwait")),
    "mitigations": KnownParam(("off", "auto", "auto,nosmt")),
    "nosmt": KnownParam(_FLAG),
    "nmi_watchdog": KnownParam(("0", "1", "panic", "nopanic")),
    "nowatchdog": KnownParam(_FLAG),
    "tsc": KnownParam(("reliable", "noirqtime", "unstable", "nowatchdog")),
    "clocksource": KnownParam(pattern=r"[a-z_]+"),
    "audit": KnownParam(("0", "1", "off", "on")),
    "selinux": KnownParam(("0", "1")),
    "apparmor": KnownParam(("0", "1")),
    "systemd.unified_cgroup_hierarchy": KnownParam(("0", "1")),
    "cgroup_enable": KnownParam(pattern=r"[a-z]+"),
    "swapaccount": KnownParam(("0", "1")),
    # console and boot
    "console": KnownParam(pattern=r"[A-Za-z0-9]+(,[0-9]+[noe]?[5-8]?r?)?", repeat=True),
    "earlyprintk": KnownParam(pattern=r"\S+"),
    "loglevel": KnownParam(pattern=r"[0-7]"),
    "quiet": KnownParam(_FLAG),
    "splash": KnownParam(_FLAG),
    "panic": KnownParam(pattern=r"-?[0-9]+"),
    "root": KnownParam(pattern=r"\S+"),
    "rootfstype": KnownParam(pattern=r"[a-z0-9]+"),
    "rootflags": KnownParam(pattern=r"\S+"),
    "ro": KnownParam(_FLAG),
    "rw": KnownParam(_FLAG),
    "init": KnownParam(pattern=r"/\S+"),
    "net.ifnames": KnownParam(("0", "1")),
    "biosdevname": KnownParam(("0", "1")),
    "systemd.log_level": KnownParam(("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")),
    "systemd.show_status": KnownParam(("0", "1", "true", "false", "auto", "error")),
    "systemd.unit": KnownParam(pattern=r"\S+"),
    "systemd.mask": KnownParam(pattern=r"\S+"),
    "systemd.wants": KnownParam(pattern=r"\S+"),
    "rd.systemd.show_status": KnownParam(("0", "1", "true", "false", "auto", "error")),
    "random.trust_cpu": KnownParam(("on", "off")),
    "crashkernel": KnownParam(pattern=r"\S+"),
}

# key (argument name, or name=value) -> (what is wrong, the right form)
WRONG: dict[str, tuple[str, str]] = {
    "pcie_bus_perf": ("not a kernel parameter on its own; it is a value of pci=", "use pci=pcie_bus_perf"),
    "pcie_bus_safe": ("not a kernel parameter on its own; it is a value of pci=", "use pci=pcie_bus_safe"),
    "pcie_bus_tune_off": ("not a kernel parameter on its own; it is a value of pci=",
                          "use pci=pcie_bus_tune_off"),
    "pcie_bus_peer2peer": ("not a kernel parameter on its own; it is a value of pci=",
                           "use pci=pcie_bus_peer2peer"),
    "pcie_replay_count": ("not a kernel parameter (it is an amdgpu sysfs file); PCIe replays are read, not set",
                          "remove it; read replays with nvidia-smi -q (\"Replays Since Reset\") or DCGM field 202 "
                          "(DCGM_FI_DEV_PCIE_REPLAY_COUNTER)"),
    "amd_iommu=on": ("not a documented value of amd_iommu (the AMD IOMMU is on by default)",
                     "drop it; intel_iommu=on is the Intel switch, iommu=pt sets passthrough on either"),
    "pcie_acs_override": ("not a mainline kernel parameter (out-of-tree patch only)",
                          "disable ACS on PCIe switches with setpci from a boot unit"),
    "pci=noacs": ("not a mainline kernel parameter value",
                  "disable ACS on PCIe switches with setpci from a boot unit"),
    "rd.blacklist": ("not a dracut option", "use rd.driver.blacklist=<module>"),
    "nvidia-drm.modeset": ("module names use '_' on the command line", "use nvidia_drm.modeset="),
}

_MODULE_OPTION = re.compile(r"[a-z0-9_]+\.[A-Za-z0-9_]+")


def split(arg: str) -> tuple[str, str | None]:
    name, eq, value = arg.partition("=")
    return name, (value if eq else None)


def check(arg: str) -> tuple[str, str] | None:
    """None when the argument is acceptable, else (what is wrong, what to do)."""
    if not arg or any(c.isspace() for c in arg):
        return ("an argument must be one word without white space", "split it into separate list items")
    name, value = split(arg)
    for key in (arg, name, f"{name}={value}" if value is not None else name):
        if key in WRONG:
            return WRONG[key]
    if name == "pci" and value:
        for part in value.split(","):
            if f"pci={part}" in WRONG:
                return WRONG[f"pci={part}"]
    known = KNOWN.get(name)
    if known is None:
        if _MODULE_OPTION.fullmatch(name) and value is not None:
            return None  # module.option=value: a module parameter on the command line
        return (f"unknown kernel parameter {name!r}",
                "check Documentation/admin-guide/kernel-parameters.txt; module options belong in "
                "kernel.modprobe")
    if known.values == _FLAG:
        if value is not None:
            return (f"{name} takes no value", f"use plain {name}")
        return None
    if value is None:
        return (f"{name} needs a value", f"use {name}=<value>")
    parts = value.split(",") if known.multi else [value]
    for part in parts:
        if known.values is not None and part not in known.values and value not in known.values:
            return (f"{part!r} is not a value of {name}", "known values: " + ", ".join(known.values))
        if known.pattern and not re.fullmatch(known.pattern, part):
            return (f"{part!r} is not a valid value of {name}", f"expected a value matching {known.pattern}")
    return None


def is_repeated(name: str) -> bool:
    k = KNOWN.get(name)
    return bool(k and k.repeat)


def is_multi(name: str) -> bool:
    k = KNOWN.get(name)
    return bool(k and k.multi)
