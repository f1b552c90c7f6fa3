"""Run inside a throwaway container of an image's base: resolve each layer's wheel requirements with
pip's --dry-run --report, layer by layer (each constrained by what the base and the layers before it
hold), and print the result as one JSON line for the host (engine.resolve.resolve_wheels)."""

import json
import pathlib
import re
import subprocess
import sys
from typing import Any


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    have = {}
    for top in ("/opt", "/usr/local"):
        for meta in pathlib.Path(top).glob("**/*.dist-info/METADATA"):
            lines = meta.read_text(errors="replace").splitlines()[:20]
            fields = dict(line.split(": ", 1) for line in lines if ": " in line)
            if "Name" in fields:
                have[norm(fields["Name"])] = fields.get("Version", "")
    return have


def sha256_of(download: dict[str, Any]) -> str:
    archive = download.get("archive_info", {})
    return str((archive.get("hashes") or {}).get("sha256") or archive.get("hash", "=").split("=", 1)[1])


def main() -> None:
    layers = json.loads(pathlib.Path("/tmp/nodeforge-pip.json").read_text())
    have = installed()
    pinned = dict(have)
    reqs: list[str] = []
    out: dict[str, Any] = {"have": have, "layers": {}}
    for layer, requirements in layers:
        reqs += requirements
        pathlib.Path("/tmp/c.txt").write_text("".join(f"{n}=={v}\n" for n, v in pinned.items()))
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--break-system-packages",
               "--only-binary=:all:", "--disable-pip-version-check", "--quiet", "--target", "/tmp/t",
               "--report", "/tmp/r.json", "-c", "/tmp/c.txt", "--", *reqs]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"pip could not resolve the wheels of layer {layer}: {' '.join(requirements)}")
        direct = [norm(re.split(r"[\s\[=<>!~;@]", r, maxsplit=1)[0]) for r in requirements]
        items = {}
        for i in json.loads(pathlib.Path("/tmp/r.json").read_text())["install"]:
            name = norm(i["metadata"]["name"])
            if name in pinned and name not in direct:
                continue  # in the base or an earlier layer
            items[name] = {"version": i["metadata"]["version"], "url": i["download_info"]["url"],
                           "sha256": sha256_of(i["download_info"])}
        for n, w in items.items():
            pinned[n] = w["version"]
        out["layers"][layer] = items
    print("@@nodeforge-wheels " + json.dumps(out))
    print("@@nodeforge-end")


if __name__ == "__main__":
    main()
