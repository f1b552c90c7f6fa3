#!/usr/bin/env python3
"""nodeforge-numa-probe: record which NUMA node and socket each GPU and NIC hangs off, and which
NIC is closest to each GPU; warn when a GPU's closest NIC sits on the other socket.

Sources, in order of trust: nvidia-smi --query-gpu for GPU identity (bus ids), sysfs
(/sys/bus/pci/devices/<bdf>/numa_node, /sys/class/infiniband/*/device) for NUMA nodes, and
nvidia-smi topo -m (its terminal escape codes stripped) for the PCIe path between each GPU and
NIC (PIX, PXB, PHB, NODE, SYS). Without nvidia-smi the GPUs are found in sysfs (vendor 0x10de,
display class) and only the NUMA nodes are compared.

Only compute NICs are paired with GPUs. A DGX H100 has twelve RDMA ports: eight compute ports, one
under each GPU's PCIe switch (mlx5_0, 3, 4, 5, 6, 9, 10, 11), and four storage / in-band ports
(mlx5_1, 2, 7, 8; DGX H100 User Guide, "Network Modules"). --compute-nics names them; without it
a NIC that shares a PCIe switch with a GPU (PIX or PXB in topo -m) is a compute NIC and the others
are storage NICs (when no NIC shares a switch with a GPU, every NIC is a compute NIC). Storage NICs
are recorded with their role and never reported as a GPU's closest NIC.

Writes a JSON record and a textfile metric. Exit status: 0 OK (also: no GPU), 1 WARNING (a
cross-socket GPU/NIC pair or a device whose firmware reports no NUMA node), 3 UNKNOWN.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nodeforge_node import Metrics, finish, parse_csv, tool

OK, WARNING, UNKNOWN = 0, 1, 3
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# nvidia-smi topo -m path kinds, nearest first (NV# is GPU-to-GPU only)
PATH_RANK = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}


@dataclass
class Nic:
    name: str
    bus_id: str | None = None
    numa_node: int | None = None
    socket: int | None = None
    netdevs: list[str] = field(default_factory=list)
    topo_label: str | None = None
    role: str = "compute"  # or "storage": storage / in-band ports are never paired with a GPU


@dataclass
class Gpu:
    index: int
    bus_id: str
    numa_node: int | None = None
    socket: int | None = None
    local_cpulist: str | None = None
    cpu_affinity: str | None = None
    numa_affinity: str | None = None
    nic_paths: dict[str, str] = field(default_factory=dict)
    closest_nic: str | None = None
    closest_path: str | None = None
    cross_socket: bool = False


@dataclass
class Topo:
    paths: dict[str, dict[str, str]] = field(default_factory=dict)  # row label -> column label -> path
    affinity: dict[str, tuple[str, str]] = field(default_factory=dict)  # GPUn -> (CPU, NUMA affinity)
    nic_names: dict[str, str] = field(default_factory=dict)  # NICn -> mlx5_n


def pci_bdf(text: str) -> str:
    """'00000000:1B:00.0' -> '0000:1b:00.0' (the sysfs form)."""
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", text)
    if not m:
        return text.strip().lower()
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def parse_topo(text: str) -> Topo:
    topo = Topo()
    columns: list[str] = []
    in_nic_legend = False
    for raw in ANSI.sub("", text).splitlines():
        if raw.strip() == "NIC Legend:":
            in_nic_legend = True
            continue
        if in_nic_legend:
            if m := re.match(r"\s*(NIC\d+):\s*(\S+)", raw):
                topo.nic_names[m.group(1)] = m.group(2)
            continue
        fields = raw.split("\t")
        if not columns and len(fields) > 1 and fields[0].strip() == "" and fields[1].strip() == "GPU0":
            columns = [f.strip() for f in fields[1:]]
            continue
        label = fields[0].strip()
        if columns and re.fullmatch(r"(GPU|NIC)\d+", label):
            values = [f.strip() for f in fields[1:]]
            matrix = [c for c in columns if re.fullmatch(r"(GPU|NIC)\d+", c)]
            topo.paths[label] = dict(zip(matrix, values[: len(matrix)], strict=False))
            rest = values[len(matrix):]
            if label.startswith("GPU") and len(rest) >= 2:
                topo.affinity[label] = (rest[0], rest[1])
    return topo


class Sysfs:
    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, *parts: str) -> str | None:
        try:
            return (self.root.joinpath(*parts)).read_text(encoding="utf-8").strip()
        except OSError:
            return None

    def numa_node(self, device_dir: Path) -> int | None:
        try:
            value = int((device_dir / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return value

    def socket_of(self, node: int | None) -> int | None:
        if node is None or node < 0:
            return None
        cpus = self.read("devices", "system", "node", f"node{node}", "cpulist")
        if cpus:
            first = re.match(r"(\d+)", cpus)
            package = first and self.read("devices", "system", "cpu", f"cpu{first.group(1)}", "topology",
                                          "physical_package_id")
            if package and package.lstrip("-").isdigit():
                return int(package)
        return node

    def pci(self, bdf: str) -> Path:
        return self.root / "bus" / "pci" / "devices" / bdf

    def nvidia_gpus(self) -> list[str]:
        found = []
        devices = self.root / "bus" / "pci" / "devices"
        for d in sorted(devices.iterdir()) if devices.is_dir() else []:
            vendor, klass = self.read("bus", "pci", "devices", d.name, "vendor"), \
                self.read("bus", "pci", "devices", d.name, "class")
            if vendor == "0x10de" and klass and klass.startswith(("0x0300", "0x0302")):
                found.append(d.name)
        return found

    def nics(self) -> list[Nic]:
        nics = []
        ib = self.root / "class" / "infiniband"
        for entry in sorted(ib.iterdir()) if ib.is_dir() else []:
            device = entry / "device"
            try:
                real = Path(os.path.realpath(device))
            except OSError:
                continue
            nic = Nic(entry.name, real.name if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", real.name)
                      else None)
            nic.numa_node = self.numa_node(real)
            nic.socket = self.socket_of(nic.numa_node)
            net = real / "net"
            nic.netdevs = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
            nics.append(nic)
        return nics


def run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, ""
    except subprocess.TimeoutExpired:
        return None, ""
    return proc.returncode, proc.stdout


def smi_gpus(out: str) -> list[Gpu]:
    """The GPUs of a --query-gpu=index,pci.bus_id answer (lines that are not rows left out)."""
    gpus = []
    for row in parse_csv(out, ("index", "pci.bus_id"), lenient=True):
        index, bus_id = row["index"], row["pci.bus_id"]
        if index is not None and index.isdigit() and bus_id is not None:
            gpus.append(Gpu(int(index), pci_bdf(bus_id)))
    return gpus


def assign_roles(nics: list[Nic], gpus: list[Gpu], topo: Topo, named: str | None, notes: list[str]) -> None:
    """Each GPU's PCIe path to each NIC (topo -m), and each NIC's role: compute or storage, as named by
    --compute-nics, else compute when it shares a PCIe switch with a GPU."""
    for gpu in gpus:
        row = topo.paths.get(f"GPU{gpu.index}", {})
        for nic in nics:
            if nic.topo_label and nic.topo_label in row:
                gpu.nic_paths[nic.name] = row[nic.topo_label]
    if named:
        wanted = {n.strip() for n in named.split(",") if n.strip()}
        for nic in nics:
            nic.role = "compute" if nic.name in wanted else "storage"
        missing = sorted(wanted - {n.name for n in nics})
        if missing:
            notes.append(f"compute NICs not found on this node: {', '.join(missing)}")
    else:
        near = {name for g in gpus for name, path in g.nic_paths.items() if path in ("PIX", "PXB")}
        if near:
            for nic in nics:
                nic.role = "compute" if nic.name in near else "storage"
    storage = [n.name for n in nics if n.role == "storage"]
    if storage:
        notes.append(f"storage / in-band NICs (not paired with a GPU): {', '.join(storage)}")


def probe(args: argparse.Namespace) -> dict[str, Any]:
    sysfs = Sysfs(Path(args.sysfs_root))
    notes: list[str] = []
    warnings: list[str] = []
    unknown: list[str] = []
    gpus: list[Gpu] = []
    code, out = run([args.nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], args.timeout)
    if code == 0:
        gpus = smi_gpus(out)
        source = "nvidia-smi"
    else:
        why = "not found" if code == 127 else "no answer" if code is None else f"exit {code}"
        notes.append(f"nvidia-smi {why}: GPUs taken from sysfs, no PCIe paths")
        gpus = [Gpu(i, bdf) for i, bdf in enumerate(sysfs.nvidia_gpus())]
        source = "sysfs"
    topo = Topo()
    if args.topo_file:
        topo = parse_topo(Path(args.topo_file).read_text(encoding="utf-8", errors="replace"))
    elif code == 0:
        tcode, tout = run([args.nvidia_smi, "topo", "-m"], args.timeout)
        if tcode == 0:
            topo = parse_topo(tout)
        else:
            unknown.append(f"nvidia-smi topo -m failed ({'no answer' if tcode is None else f'exit {tcode}'})")
    nics = sysfs.nics()
    by_name = {n.name: n for n in nics}
    for label, name in topo.nic_names.items():
        if name not in by_name:
            nic = Nic(name)
            nics.append(nic)
            by_name[name] = nic
        by_name[name].topo_label = label
    assign_roles(nics, gpus, topo, args.compute_nics, notes)
    compute = [n for n in nics if n.role == "compute"]
    for gpu in gpus:
        gpu.numa_node = sysfs.numa_node(sysfs.pci(gpu.bus_id))
        gpu.local_cpulist = sysfs.read("bus", "pci", "devices", gpu.bus_id, "local_cpulist")
        gpu.socket = sysfs.socket_of(gpu.numa_node)
        label = f"GPU{gpu.index}"
        if label in topo.affinity:
            gpu.cpu_affinity, gpu.numa_affinity = topo.affinity[label]
        if gpu.numa_node is not None and gpu.numa_node < 0:
            warnings.append(f"GPU {gpu.index} ({gpu.bus_id}): the firmware reports no NUMA node (numa_node -1): "
                            "bind by hand or fix the BIOS (ACPI SRAT/_PXM)")
        candidates = [(PATH_RANK.get(p, 9), name) for name, p in gpu.nic_paths.items()
                      if by_name[name].role == "compute"]
        if candidates:
            _, gpu.closest_nic = min(candidates)
            gpu.closest_path = gpu.nic_paths[gpu.closest_nic]
        elif compute:  # no PCIe paths: nearest by NUMA node
            same = [n for n in compute if n.numa_node == gpu.numa_node and n.numa_node is not None]
            gpu.closest_nic = (same or compute)[0].name
        if gpu.closest_nic:
            nic = by_name[gpu.closest_nic]
            if gpu.socket is not None and nic.socket is not None:
                gpu.cross_socket = gpu.socket != nic.socket
            else:
                gpu.cross_socket = gpu.closest_path == "SYS"
            if gpu.cross_socket:
                where = f"socket {gpu.socket}" if gpu.socket is not None else "its NUMA node"
                warnings.append(
                    f"GPU {gpu.index} ({gpu.bus_id}) on {where}: its closest NIC {nic.name} "
                    f"({gpu.closest_path or 'by NUMA node'}) is on "
                    f"{'socket ' + str(nic.socket) if nic.socket is not None else 'another socket'}: "
                    "GPUDirect RDMA traffic crosses the CPU interconnect")
    for nic in nics:
        if nic.numa_node is not None and nic.numa_node < 0:
            warnings.append(f"NIC {nic.name} ({nic.bus_id}): the firmware reports no NUMA node (numa_node -1)")
    if not gpus:
        notes.append("no NVIDIA GPU found")
    status = UNKNOWN if unknown else WARNING if warnings else OK
    return {
        "status": {OK: "OK", WARNING: "WARNING", UNKNOWN: "UNKNOWN"}[status], "exit_code": status,
        "gpu_source": source, "gpus": [asdict(g) for g in gpus], "nics": [asdict(n) for n in nics],
        "cross_socket_gpus": sum(1 for g in gpus if g.cross_socket),
        "warnings": warnings, "notes": notes, "unknown": unknown,
    }


def metrics(doc: dict[str, Any]) -> str:
    m = Metrics()
    gpu_node, nic_node = "nodeforge_numa_gpu_numa_node", "nodeforge_numa_nic_numa_node"
    cross = "nodeforge_numa_gpu_nic_cross_socket"
    m.declare(gpu_node, "gauge", "NUMA node a GPU is attached to (-1: the firmware reports none).")
    for g in doc["gpus"]:
        m.sample(gpu_node, g["numa_node"] if g["numa_node"] is not None else -1,
                 {"gpu": str(g["index"]), "bus_id": g["bus_id"]})
    m.declare(nic_node, "gauge", "NUMA node an RDMA NIC is attached to.")
    for n in doc["nics"]:
        m.sample(nic_node, n["numa_node"] if n["numa_node"] is not None else -1, {"nic": n["name"], "role": n["role"]})
    m.declare(cross, "gauge", "1 when a GPU's closest NIC is on another socket.")
    for g in doc["gpus"]:
        if g["closest_nic"]:
            m.sample(cross, int(g["cross_socket"]),
                     {"gpu": str(g["index"]), "nic": g["closest_nic"], "path": g["closest_path"] or "unknown"})
    m.gauge("nodeforge_numa_cross_socket_gpus", "GPUs whose closest NIC is on another socket.",
            doc["cross_socket_gpus"])
    m.gauge("nodeforge_numa_probe_last_run_timestamp_seconds", "When the topology was last probed.", int(time.time()))
    return m.text()


def report(doc: dict[str, Any]) -> str:
    lines = [f"NUMA-TOPOLOGY {doc['status']} - {len(doc['gpus'])} GPUs, {len(doc['nics'])} NICs, "
             f"{doc['cross_socket_gpus']} GPUs with a cross-socket closest NIC"]
    for g in doc["gpus"]:
        nic = f", closest NIC {g['closest_nic']} ({g['closest_path'] or 'by NUMA node'})" if g["closest_nic"] else ""
        lines.append(f"  GPU {g['index']} {g['bus_id']}: NUMA node {g['numa_node']}, socket {g['socket']}{nic}")
    lines += [f"WARNING {w}" for w in doc["warnings"]]
    lines += [f"UNKNOWN {u}" for u in doc["unknown"]]
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nodeforge-numa-probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--nvidia-smi", default=tool("nvidia-smi"))
    p.add_argument("--topo-file", default=None, help="read nvidia-smi topo -m output from this file")
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument("--compute-nics", default=None,
                   help="comma-separated RDMA devices that carry GPU traffic (the others are storage NICs); "
                        "default: the NICs that share a PCIe switch with a GPU")
    p.add_argument("--output", default=None, help="write the JSON record here")
    p.add_argument("--textfile", default=None, help="write numa_topology.prom into this directory")
    p.add_argument("--json", action="store_true", help="print the JSON record instead of text")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per nvidia-smi call")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    doc = probe(args)
    return finish(doc, report, json_out=args.json, json_file=args.output,
                  textfile=Path(args.textfile) / "numa_topology.prom" if args.textfile else None, metrics=metrics)

if __name__ == "__main__":
    sys.exit(main())
