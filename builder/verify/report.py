"""Reports of a test run: a summary on standard output, JSON and JUnit XML files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from xml.etree import ElementTree as ET

from ..plan import BuildPlan
from .result import Result


def summary(plan: BuildPlan, results: list[Result]) -> None:
    for r in results:
        mark = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip", "not-run": "----"}[r.status]
        extra = f"  ({r.message})" if r.message else ""
        print(f"{mark} [{r.test.scope}] {r.test.layer}: {r.test.name}{extra}")
        if r.status == "failed" and r.output:
            print("     | " + "\n     | ".join(r.output.strip().splitlines()[-10:]))
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped", "not-run")}
    print(f"{plan.image}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
          f"{counts['not-run']} not run")


def write_reports(plan: BuildPlan, results: list[Result], report_dir: Path) -> tuple[Path, Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    data = {"image": plan.image, "key": plan.key, "tags": list(plan.tags),
            "results": [r.to_json() for r in results],
            "counts": {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped", "not-run")}}
    json_path = report_dir / f"{plan.image}.json"
    _atomic_write(json_path, json.dumps(data, indent=2) + "\n")
    suites = ET.Element("testsuites", name=f"nodeforge {plan.image}")
    for scope in ("image", "container", "boot"):
        rs = [r for r in results if r.test.scope == scope]
        if not rs:
            continue
        suite = ET.SubElement(suites, "testsuite", name=f"{plan.image}.{scope}", tests=str(len(rs)),
                              failures=str(sum(r.status == "failed" for r in rs)),
                              skipped=str(sum(r.status in ("skipped", "not-run") for r in rs)),
                              time=f"{sum(r.seconds for r in rs):.3f}")
        for r in rs:
            case = ET.SubElement(suite, "testcase", classname=f"{plan.image}.{scope}.{r.test.layer}",
                                 name=r.test.name, time=f"{r.seconds:.3f}")
            if r.status == "failed":
                ET.SubElement(case, "failure", message=r.message).text = r.output[-4000:]
            elif r.status in ("skipped", "not-run"):
                ET.SubElement(case, "skipped", message=r.message)
    xml_path = report_dir / f"{plan.image}.junit.xml"
    _atomic_write(xml_path, ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n")
    return json_path, xml_path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
