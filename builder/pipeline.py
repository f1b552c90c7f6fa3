"""The pipeline: what `nodeforge build` does for each image, in order: compose, lock policy,
bootstrap, one cached engine build per layer step, the initramfs step, SBOM and labels, assembly.

A step whose key exists in the engine (tag nodeforge-cache:<key>) is not rebuilt, so a no-op
rebuild costs hashing and one inspect per step. Images build FROM other images of ours;
independent images build in parallel."""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from . import lockfile as lock
from .compose.image import compose, lock_config, output_name
from .compose.pairs import owners
from .compose.params import Overrides
from .compose.phases import boot_step_key, engine_steps
from .definitions.load import Tree
from .engine import bootstrap, cancel, initramfs, offline, sbom
from .engine import cache as rebuild
from .engine import client as engine
from .engine import resolve as resolver
from .engine.dockerfile import label_fragment, step_dockerfile, write_context
from .engine.labels import oci_labels
from .engine.steps import engine_build, step_ref
from .errors import BuildFailed
from .fleetcache import cache as fleet
from .manifest import image_digest, layer_secrets
from .manifest import record as manifest
from .mirror import offline as mirror_check
from .node import assemble
from .node.signing import Secrets
from .paths import build_dir
from .plan import BuildPlan, LayerStep, digest
from .progress import Progress, Timer


@dataclass
class StepResult:
    layer: str
    key: str
    status: str  # cached | built
    seconds: float
    reason: str = ""  # why it was built


@dataclass
class BuildResult:
    image: str
    plan: BuildPlan
    ref: str  # the final image, tagged with every output tag
    content_ref: str  # the last layer step (what child images build FROM)
    id: str
    size: int
    tags: tuple[str, ...]
    labels: dict[str, str]
    steps: list[StepResult] = field(default_factory=list)
    node: assemble.NodeArtifacts | None = None  # disks and netboot artifacts of a node image
    initramfs: StepResult | None = None  # a node image's: cached, reused (same inputs), built or inherited


class Builder:
    def __init__(self, tree: Tree, config: str | None, sets: Overrides, progress: Progress,
                 locked: bool = False, log_dir: Path | None = None, secrets: Secrets | None = None,
                 formats: list[str] | None = None, mirror: Path | None = None,
                 cache: fleet.SharedCache | None = None) -> None:
        self.tree, self.config, self.sets, self.progress = tree, config, sets, progress
        self.locked = locked
        self.formats = formats  # --format: node outputs of this build, instead of outputs.formats
        self.secrets = secrets or Secrets()  # --secret values, checked; the assembler signs with module_signing
        self.log_dir = log_dir or build_dir(tree.root) / "logs"
        self.cache = cache  # the fleet cache: keyed images pulled on a miss, pushed once built (builder.fleetcache)
        self.mirror = mirror  # an offline build: no network, packages and bases from this checked mirror
        self.bases: dict[str, tuple[str, str]] = {}  # base key -> (tarball in the mirror, its sha256)
        self.results: dict[str, BuildResult] = {}
        self.resolved: dict[str, lock.Lock] = {}  # lock name -> this build's resolution (under build/resolved/)
        self._lock = threading.Lock()
        self._swept = False  # the containers of killed builds removed (once, at the first image)

    # --- planning -------------------------------------------------------------------------------
    def plan(self, image: str) -> BuildPlan:
        with self._lock:
            resolved = dict(self.resolved)
        plan = compose(self.tree, image, self.config, self.sets, locks=resolved)
        if self.formats is not None and plan.kind == "node":
            plan = dataclasses.replace(plan, outputs={**plan.outputs, "formats": list(self.formats)})
        return plan

    def _ensure_locked(self, c: docker.DockerClient, plan: BuildPlan, base_ref: str) -> BuildPlan:
        """The lock policy. A build never writes a lock file (a tracked file): a plan its lock file does
        not fully pin is resolved into build/resolved/ (reused by the next build while it pins every
        layer) and `nodeforge lock` is named to lock it; --locked refuses any drift."""
        if self.mirror:  # offline: mirror_check.prepare found every package locked and mirrored
            return plan
        owner = lock_config(plan)
        name, command = lock.lock_name(plan.image, owner), lock.lock_command(plan.image, owner)
        what = (f"images/{name}.lock does not pin every layer" if lock.path_for(self.tree.root, plan.image, owner)
                .is_file() else f"no images/{name}.lock")
        if self.locked:
            current = lock.read(self.tree.root, plan.image, owner)
            fresh = resolver.resolve(c, plan, base_ref, self.progress)
            changes = lock.diff(current, fresh)
            if changes:
                raise BuildFailed(f"--locked: resolution of {plan.image} differs from images/{name}.lock:\n"
                                  + "\n".join(changes) + f"\nrun `{command}` to accept the change")
            return plan
        if all(s.locked for s in plan.steps):
            return plan
        path = lock.resolved_path(self.tree.root, plan.image, owner)
        kept = lock.read(self.tree.root, plan.image, owner, path)
        if kept is not None:
            with self._lock:
                self.resolved[name] = kept
            again = self.plan(plan.image)
            if all(s.locked for s in again.steps):
                self.progress.say(plan.image, f"{what}: using the resolution in {self._shown(path)}; "
                                  f"`{command}` writes the lock file")
                return again
        fresh = dataclasses.replace(resolver.resolve(c, plan, base_ref, self.progress), config=owner)
        lock.write(self.tree.root, fresh, path)
        with self._lock:
            self.resolved[name] = fresh
        self.progress.say(plan.image, f"{what}: resolved into {self._shown(path)} (no lock file written); "
                          f"`{command}` writes the lock file")
        return self.plan(plan.image)

    def _shown(self, path: Path) -> str:
        return str(path.relative_to(self.tree.root)) if path.is_relative_to(self.tree.root) else str(path)

    def resolve_lock(self, image: str) -> tuple[lock.Lock | None, lock.Lock]:
        """(the lock file's, a fresh resolution) of an image with the builder's config, on its real base
        (its parent built first); both of the lock file that (image, config) owns (lock.config)."""
        plan = self.plan(image)
        owner = lock_config(plan)
        c = engine.client()
        if plan.base.kind == "debian":
            base_ref = bootstrap.ensure(c, plan.base, self.progress, image)
        else:
            parent = self.build([plan.base.image or ""], jobs=1)[-1]
            base_ref = parent.content_ref
        fresh = dataclasses.replace(resolver.resolve(c, plan, base_ref, self.progress), config=owner)
        return lock.read(self.tree.root, image, owner), fresh

    # --- building -------------------------------------------------------------------------------
    def build(self, images: list[str], jobs: int = 1) -> list[BuildResult]:
        order = self._closure(images)
        for stray in assemble.remove_strays(self.tree.root):  # what a killed build left (SIGKILL)
            self.progress.say(order[0], f"removed {stray} (left by a build that was killed)")
        if self.mirror:  # every file checked and every image covered before anything is used
            index = mirror_check.prepare(self.tree.root, [self.plan(n) for n in order], self.mirror, self.progress)
            self.bases = index.base_files()
        pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="nodeforge-build")
        interrupted = False
        try:
            self._run(pool, order)
        except KeyboardInterrupt:  # do not wait for running builds: they stop (engine.cancel), the CLI
            interrupted = True     # removes what they leave
            raise
        finally:
            pool.shutdown(wait=not interrupted, cancel_futures=interrupted)
        return [self.results[n] for n in order]

    def _run(self, pool: ThreadPoolExecutor, order: list[str]) -> None:
        pending: dict[str, Future[BuildResult]] = {}

        def submit(name: str) -> Future[BuildResult]:
            if name in pending:
                return pending[name]
            parent = self.tree.images[name].data["from"].get("image")
            parent_future = submit(parent) if parent else None
            pending[name] = pool.submit(self._build_after, name, parent_future)
            return pending[name]

        for name in order:
            submit(name)
        done, _ = wait(list(pending.values()), return_when=FIRST_EXCEPTION)
        for fut in done:
            exc = fut.exception()
            if exc:
                for other in pending.values():
                    other.cancel()
                raise exc
        wait(list(pending.values()))
        for fut in pending.values():
            fut.result()

    def _closure(self, images: list[str]) -> list[str]:
        order: list[str] = []

        def add(name: str) -> None:
            parent = self.tree.images[name].data["from"].get("image")
            if parent:
                add(parent)
            if name not in order:
                order.append(name)

        for i in images:
            add(self.tree.image(i).name)
        return order

    def _build_after(self, name: str, parent: Future[BuildResult] | None) -> BuildResult:
        parent_result = parent.result() if parent else None
        cancel.check()
        with engine.image_lock(self.tree.root, name):  # two builds of one image never interleave
            cancel.check()  # stopped while it waited for the lock: it does not begin
            return self.build_one(name, parent_result)

    def _base(self, c: docker.DockerClient, plan: BuildPlan, parent: BuildResult | None) -> tuple[str, str, str]:
        """(ref to build on, its name and digest for the labels): a bootstrapped base or the parent image."""
        if plan.base.kind == "debian":
            if self.mirror:
                rel, sha256 = self.bases[plan.base.key]
                base_ref = bootstrap.ensure(c, plan.base, self.progress, plan.image, self.mirror / rel, sha256,
                                            shared=self.cache)
            else:
                base_ref = bootstrap.ensure(c, plan.base, self.progress, plan.image, shared=self.cache)
            return base_ref, base_ref, engine.inspect(c, base_ref)["Id"]
        assert parent is not None
        self.progress.say(plan.image, f"base image {parent.image:<22} {parent.tags[0]}")
        return parent.content_ref, parent.tags[0], parent.id

    def _build_steps(self, c: docker.DockerClient, plan: BuildPlan, base_ref: str, state: rebuild.State
                     ) -> tuple[str, list[StepResult]]:
        """One cached engine build per layer step; (the last step's ref, what each step did)."""
        steps = engine_steps(plan)
        results: list[StepResult] = []
        ref, parent_key, parent_name = base_ref, plan.base.key, "the base"
        for i, step in enumerate(steps, start=1):
            results.append(self._step(c, plan, step, ref, f"layer {i}/{len(steps)} {step.layer:<20}",
                                      f"{i:02d}-{step.layer}", state, parent_key, parent_name))
            ref, parent_key, parent_name = step_ref(step.key), step.key, f"layer {step.layer}"
        state.save()
        return ref, results

    def _boot_step(self, c: docker.DockerClient, plan: BuildPlan, parent_ref: str, parent_key: str,
                   state: rebuild.State) -> tuple[str, str, StepResult]:
        """A node's boot configuration (compose.phases) on top of its initramfs step: keyed on that
        step and its own files, so an edit of a sysctl value or a kernel argument builds this step alone."""
        assert plan.boot is not None
        key, after = boot_step_key(plan, parent_key), "the initramfs" if parent_key != plan.layers_key else "the layers"
        step = dataclasses.replace(plan.boot, key=key)
        result = self._step(c, plan, step, parent_ref, f"{step.layer + ' (after the initramfs)':<33}", step.layer,
                            state, parent_key, after)
        state.save()
        return step_ref(key), key, result

    def _step(self, c: docker.DockerClient, plan: BuildPlan, step: LayerStep, ref: str, title: str, log_name: str,
              state: rebuild.State, parent_key: str, parent_name: str) -> StepResult:
        """One cached engine step on ref: found in the engine or the fleet cache, else built (and said why)."""
        cancel.check()
        name, tag = plan.image, step_ref(step.key)
        fp = rebuild.fingerprint(step, parent_key, parent_name)
        why = ""
        with Timer() as t:
            found = fleet.have(c, self.cache, tag, "step", step.key, name)
            if found:
                status = found
            else:
                why = rebuild.reason(state.previous(step.layer), fp)
                self.progress.say(name, f"{title} building ... ({why})")
                self.progress.stage(name, f"{title.strip()}: building")
                log = self.log_dir / name / f"{log_name}.log"
                if plan.install is not None and step.key == plan.install.key and (self.mirror or step.wheels):
                    offline.package_step(c, step, ref, plan.base.epoch, self.mirror, log)
                elif step.host_sources:
                    offline.source_step(c, step, ref, plan.base.epoch, self.mirror is not None, log)
                else:
                    self._engine_step(c, step, ref, plan, tag, log)
                status = "built"
                fleet.built(c, self.cache, tag, "step", step.key, name)
        self.progress.say(name, f"{title} {status:<8} {t.seconds:6.1f}s  {step.key[:12]}")
        state.record(step.layer, fp)
        return StepResult(step.layer, step.key, status, t.seconds, why)

    def _engine_step(self, c: docker.DockerClient, step: LayerStep, parent_ref: str, plan: BuildPlan, tag: str,
                     log: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="nodeforge-ctx-") as tmp, cancel.scratch(Path(tmp)):
            write_context(step, Path(tmp))
            try:
                engine_build(c, Path(tmp), step_dockerfile(step, parent_ref, plan.base.epoch), tag, log,
                             None,
                             on_line=lambda line: self.progress.output(plan.image, line),
                             network_mode="none" if self.mirror else None)
            except BuildFailed as e:
                if not self.mirror:
                    raise
                raise BuildFailed(f"{e}\nthis is an offline build: a step of layer {step.layer} that downloads "
                                  "(a vendor install) cannot; give it its files another way (a layer parameter "
                                  "such as an offline source) or build it where the network is") from None

    def _finalise(self, c: docker.DockerClient, plan: BuildPlan, content_ref: str, content_key: str,
                  base: tuple[str, str, str]) -> tuple[str, dict[str, str]]:
        """SBOM, OCI labels and the default user on top of the content, tagged; (ref, labels)."""
        labels = oci_labels(plan, self.tree.root, base[1], base[2])
        _, sbom_sha = sbom.write(c, content_ref, plan, self.tree.root)
        labels[sbom.LABEL] = sbom_sha
        meta_inputs: dict[str, Any] = {"content": content_key, "labels": labels}
        user = f"USER {plan.user}\n" if plan.user else ""  # the final image only: children build as root
        if user:
            meta_inputs["user"] = plan.user
        meta_key = digest(meta_inputs)
        meta_ref = step_ref(meta_key)
        if not fleet.have(c, self.cache, meta_ref, "step", meta_key, plan.image):
            with tempfile.TemporaryDirectory(prefix="nodeforge-ctx-") as tmp, cancel.scratch(Path(tmp)):
                engine_build(c, Path(tmp), f"FROM {content_ref}\n" + label_fragment(labels) + user, meta_ref,
                             self.log_dir / plan.image / "labels.log")
            fleet.built(c, self.cache, meta_ref, "step", meta_key, plan.image)
        for tag in plan.tags:
            repo, tg = engine.split_ref(tag)
            c.api.tag(meta_ref, repo, tg)
        return meta_ref, labels

    def _remove_orphans(self, c: docker.DockerClient, image: str) -> None:
        """Once per build: the containers that killed nodeforge processes of this machine left."""
        with self._lock:
            if self._swept:
                return
            self._swept = True
        for cid in engine.remove_orphans(c):
            self.progress.say(image, f"removed container {cid} (left by a build that was killed)")

    def _digests(self, plan: BuildPlan, image_id: str, labels: dict[str, str]) -> image_digest.Digests:
        """The image's normalised OCI digest (cached by engine id and layer): computed while a node is
        assembled, on a client of its own."""
        with Timer() as t:
            digests = image_digest.of_build(engine.client(), plan, image_id, labels)
        self.progress.say(plan.image, f"OCI digest {digests.image[:19]}      {t.seconds:6.1f}s")
        return digests

    def build_one(self, name: str, parent: BuildResult | None) -> BuildResult:
        """The whole pipeline for one image: base, lock policy, layer steps, the initramfs step of a
        node, SBOM and labels, assembly of a node's disks."""
        c = engine.client()
        self._remove_orphans(c, name)
        plan = self.plan(name)
        with Timer() as total:
            base = self._base(c, plan, parent)
            plan = self._ensure_locked(c, plan, base[0])
            state = rebuild.State(self.tree.root, output_name(plan))  # one record per (image, config) owner
            content_ref, results = self._build_steps(c, plan, base[0], state)
            content_key = plan.layers_key
            initrd = None
            if plan.kind == "node":
                self.progress.stage(name, "initramfs")
                up = (initramfs.Parent(parent.initramfs.key, parent.plan.base.epoch)
                      if parent is not None and parent.initramfs is not None else None)
                with Timer() as t:
                    content_ref, content_key, status = initramfs.step(c, plan, content_ref, self.tree.root,
                                                                      self.progress, self.log_dir / name, up,
                                                                      shared=self.cache)
                initrd = StepResult("initramfs", initramfs.inputs_key(plan, up), status, t.seconds)
            if plan.boot is not None:
                content_ref, content_key, boot = self._boot_step(c, plan, content_ref, content_key, state)
                results.append(boot)
            layer_secrets.check(c, content_ref, name)
            cancel.check()
            meta_ref, labels = self._finalise(c, plan, content_ref, content_key, base)
            info = engine.inspect(c, meta_ref)
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nodeforge-digest") as side:
                digests = side.submit(self._digests, plan, info["Id"], labels)
                if plan.kind == "node":
                    self.progress.stage(name, "assemble: disks and netboot artifacts")
                node = (assemble.assemble(c, plan, content_ref, content_key, self.tree.root, self.progress,
                                          signing=self.secrets.module_signing)
                        if plan.kind == "node" else None)
                with self._lock:
                    resolved = dict(self.resolved)
                manifest.write(self.tree, plan, digests.result(), labels, node, resolved)  # manifest.json, provenance
        self.progress.done(name)
        built = sum(r.status == "built" for r in results)
        pulled = sum(r.status == "pulled" for r in results)
        fetched = f"{pulled} pulled from the fleet cache, " if pulled else ""
        self.progress.say(name, f"done in {total.seconds:.1f}s: {built} built, {fetched}"
                          f"{len(results) - built - pulled} cached; "
                          f"{', '.join(plan.tags)} ({info['Size'] / 1e6:.0f} MB)")
        result = BuildResult(name, plan, plan.tags[0], content_ref, info["Id"], info["Size"], plan.tags, labels,
                             results, node, initrd)
        with self._lock:
            self.results[name] = result
        return result



def check_locks(tree: Tree, progress: Progress, sets: Overrides | None = None) -> dict[str, list[str]]:
    """`nodeforge lock --check --all`: every lock file the tree's (image, config) pairs own (one per
    owner, compose.pairs.owners), each against a fresh resolution: lock name -> the drift lines
    (lockfile.drift: changed packages, and packages held below a security update; empty when
    current). A pair with no lock file drifts by every package."""
    out: dict[str, list[str]] = {}
    for name, pair in owners(tree).items():
        current, fresh = Builder(tree, pair.config, list(sets or []), progress).resolve_lock(pair.image)
        out[name] = lock.drift(current, fresh)
    return out
