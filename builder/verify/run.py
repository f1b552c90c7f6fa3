"""Stage 7: verification. Image-scope checks read the image's config and files without running
anything; container-scope checks run in a test container; boot-scope checks run in a booted VM
(verify.boot). Reports: JUnit XML and JSON. Exit 0 pass, 1 fail, 2 environment."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from ..definitions.load import Tree
from ..engine import client as engine
from ..errors import EXIT_FAIL, EXIT_OK, EnvironmentProblem
from ..plan import BuildPlan, Test
from .boot import MODES, run_boot_tests
from .container import TestContainer, check_entrypoint, check_in_container
from .host import capabilities
from .image import IMAGE_CHECKS, ImageView
from .report import summary, write_reports
from .result import Result


def run_image_and_container(plan: BuildPlan, ref: str, tests: list[Test]) -> list[Result]:
    c = engine.client()
    results: list[Result] = []
    image_tests = [t for t in tests if t.scope == "image"]
    container_tests = [t for t in tests if t.scope == "container"]
    if image_tests:
        view = ImageView(c, ref)
        try:
            for t in image_tests:
                start = time.monotonic()
                try:
                    why = IMAGE_CHECKS[t.kind](view, t.spec)
                except Exception as e:  # a broken check is a failed check, with its reason
                    why = f"check raised {type(e).__name__}: {e}"
                results.append(Result(t, "failed" if why else "passed", why, time.monotonic() - start))
        finally:
            view.close()
    # an entrypoint test starts a container of its own: an image without a shell (compose.cut)
    # needs no sleeper for it
    for t in container_tests:
        if t.kind == "entrypoint":
            start = time.monotonic()
            why, output = check_entrypoint(ref, t.spec, gpu="gpu" in t.requires)
            results.append(Result(t, "failed" if why else "passed", why, time.monotonic() - start, output))
    shell_tests = [t for t in container_tests if t.kind != "entrypoint"]
    if shell_tests:
        box = TestContainer(ref, uuid.uuid4().hex[:12])
        try:
            for t in shell_tests:
                start = time.monotonic()
                why, output = check_in_container(box, t)
                results.append(Result(t, "failed" if why else "passed", why, time.monotonic() - start, output))
        finally:
            box.close()
    by_test = {id(r.test): r for r in results[len(image_tests):]}  # the container tests in the plan's order
    return results[:len(image_tests)] + [by_test[id(t)] for t in container_tests]


def select(plan: BuildPlan, caps: dict[str, bool]) -> tuple[list[Test], list[Result]]:
    runnable, skipped = [], []
    for t in plan.tests:
        missing = [r for r in t.requires if not caps.get(r)]
        if missing:
            skipped.append(Result(t, "skipped", f"requires {', '.join(missing)}, not present here"))
        else:
            runnable.append(t)
    return runnable, skipped


def run_tests(plan: BuildPlan, report_dir: Path, boot: bool, tree: Tree, ref: str | None = None,
              boot_modes: tuple[str, ...] | None = None) -> int:
    ref = ref or plan.tags[0]
    c = engine.client()
    if not engine.image_exists(c, ref):
        raise EnvironmentProblem(f"image {ref} is not built; run `{plan.build_command}`")
    caps = capabilities()
    runnable, results = select(plan, caps)
    results += run_image_and_container(plan, ref, [t for t in runnable if t.scope != "boot"])
    boot_tests = [t for t in runnable if t.scope == "boot"]
    if boot_tests:
        if plan.kind != "node":
            results += [Result(t, "not-run", "boot scope: not a node image") for t in boot_tests]
        elif not boot:
            results += [Result(t, "not-run", "boot scope: runs in a booted VM (nodeforge test --boot)")
                        for t in boot_tests]
        else:
            results += run_boot_tests(plan, tree, boot_tests, boot_modes or MODES)
    write_reports(plan, results, report_dir)
    summary(plan, results)
    return EXIT_FAIL if any(r.status == "failed" for r in results) else EXIT_OK
