"""A keyed engine image shared through an OCI registry.

An entry is an engine image tagged REGISTRY/REPO:<kind>-<key> (kind: base or step; the key is the
content key the build computed, so an entry is only ever looked up by what it must contain) and a
signature beside it, tagged <entry>.sig: an OCI manifest whose one blob is the statement
{"entry": ..., "image": <engine image id>} and whose annotation is the Ed25519 signature of those
bytes. The image id is the digest of the image's configuration, which names every layer's
content: a statement fixes the whole content of its entry.

Reading: the signature first; it must verify against the operator's public key and name this
entry; the entry's manifest must carry the signed image id as its configuration; only then is the
entry pulled, by manifest digest, and its id checked once more. Anything else is refused, named,
and the step is built locally. Writing: the image first, its signature last, so that an entry
whose push broke off has no signature and no reader takes it for complete.

A registry that cannot be reached, answers slowly, is full or answers errors never fails a build
that could succeed locally: the first fault is a warning naming the registry, the cache is left
alone for the rest of the build, which goes on locally; with `required` the fault is an error."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import requests

from ..errors import BuildFailed
from ..progress import Progress
from .registry import OCI_MANIFEST, Location, Registry, RegistryFault
from .signature import PublicKey, SigningKey

SIGNATURE_TYPE = "application/vnd.nodeforge.cache-signature.v1"
STATEMENT_TYPE = "application/vnd.nodeforge.cache-statement.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
SIGNATURE_ANNOTATION = "io.nodeforge.signature"
VERSION = 1
STALL_SECONDS = 120  # an engine pull or push that reports no progress this long is a fault (a stalled registry)


def entry_name(kind: str, key: str) -> str:
    return f"{kind}-{key}"


def statement(entry: str, image_id: str) -> bytes:
    return json.dumps({"nodeforge-cache": VERSION, "entry": entry, "image": image_id}, sort_keys=True,
                      separators=(",", ":")).encode()


class Refused(Exception):
    """An entry that is there but may not be used: the step is built locally."""


@dataclass
class Figures:
    pulled: int = 0  # entries
    pushed: int = 0
    refused: list[str] = field(default_factory=list)
    bytes_pulled: int = 0  # compressed layer bytes that crossed the network
    bytes_pushed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"pulled": self.pulled, "pushed": self.pushed, "refused": list(self.refused),
                "bytes_pulled": self.bytes_pulled, "bytes_pushed": self.bytes_pushed}


@contextlib.contextmanager
def _stall_limit(c: docker.DockerClient) -> Iterator[None]:
    """The engine call's socket timeout lowered to STALL_SECONDS while it pulls or pushes (each
    build thread has a client of its own)."""
    before = c.api.timeout
    c.api.timeout = STALL_SECONDS
    try:
        yield
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout, TimeoutError) as e:
        raise RegistryFault(f"the engine's transfer stalled or broke off ({type(e).__name__})") from None
    finally:
        c.api.timeout = before


def _layer_statuses(chunks: Any, what: str) -> dict[str, str]:
    """short layer id -> the engine's last status for it, from a pull's or push's stream; a
    RegistryFault for an error message in the stream."""
    statuses: dict[str, str] = {}
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            raise RegistryFault(f"{what}: {str(chunk['error']).strip()[:300]}")
        if chunk.get("id") and chunk.get("status"):
            statuses[str(chunk["id"])] = str(chunk["status"])
    return statuses


def _moved_bytes(manifest: dict[str, Any], statuses: dict[str, str], moved: tuple[str, ...],
                 ids: list[str] | None = None) -> int:
    """The compressed bytes of the manifest's layers whose status says they crossed the network. A
    pull names a layer by its blob digest, a push by its diff id (ids: the image's, in layer order)."""
    total = 0
    for i, layer in enumerate(manifest.get("layers") or []):
        name = ids[i] if ids is not None and i < len(ids) else str(layer.get("digest", ""))
        if statuses.get(name.removeprefix("sha256:")[:12], "").startswith(moved):
            total += int(layer.get("size") or 0)
    return total


class SharedCache:
    def __init__(self, location: Location, progress: Progress, public_key: PublicKey | None = None,
                 signing: SigningKey | None = None, required: bool = False, timeout: float = 10.0) -> None:
        self.location, self.progress = location, progress
        self.public_key, self.signing, self.required = public_key, signing, required
        self.registry = Registry(location, timeout)
        self.figures = Figures()
        self.down = False
        self._lock = threading.Lock()

    # --- faults ---------------------------------------------------------------------------------
    def _fault(self, image: str, e: Exception) -> None:
        if self.required:
            raise BuildFailed(f"{e}\n--cache-required: the build stops; make the registry answer or build "
                              "without --cache-required (the build then goes on locally)")
        with self._lock:
            first, self.down = not self.down, True
        if first:
            self.progress.say(image, f"warning: cache {self.location}: {e}; the build goes on locally and "
                              "uses the cache no more")

    # --- reading --------------------------------------------------------------------------------
    def fetch(self, c: docker.DockerClient, local_ref: str, entry: str, image: str) -> bool:
        """Pull the entry, verified, and tag it local_ref; False (the caller builds) on a miss, a refusal
        or a fault."""
        if self.down or self.public_key is None:
            return False
        try:
            signed = self._signed_image(entry)
            if signed is None:
                return False
            image_id, manifest, manifest_digest = signed
            with _stall_limit(c):
                statuses = _layer_statuses(c.api.pull(f"{self.location}@{manifest_digest}", stream=True,
                                                      decode=True), f"registry {self.location.host}: pulling {entry}")
            pulled = f"{self.location}@{manifest_digest}"
            got = c.api.inspect_image(pulled)["Id"]
            if got != image_id:  # the engine's content is not what was signed: never tagged
                c.api.remove_image(pulled, force=True)
                raise Refused(f"pulled image {got[:19]} is not the signed {image_id[:19]}")
            repo, _, tag = local_ref.rpartition(":")
            c.api.tag(got, repo, tag)
            try:
                c.api.remove_image(pulled)  # the registry's name; the image stays under local_ref
            except docker.errors.APIError:
                pass
        except Refused as e:
            with self._lock:
                self.figures.refused.append(entry)
            self.progress.say(image, f"warning: cache {self.location}: entry {entry[:24]} refused ({e}); "
                              "building it here")
            return False
        except RegistryFault as e:
            self._fault(image, e)
            return False
        except docker.errors.APIError as e:
            self._fault(image, RegistryFault(f"registry {self.location.host}: the engine could not pull {entry}: "
                                             f"{e.explanation or e}"))
            return False
        with self._lock:
            self.figures.pulled += 1
            self.figures.bytes_pulled += _moved_bytes(manifest, statuses, ("Pull complete", "Download complete"))
        return True

    def _signed_image(self, entry: str) -> tuple[str, dict[str, Any], str] | None:
        """(signed image id, the entry's manifest, its digest), None where the entry is not complete
        (no signature: never pushed, or its push broke off); Refused where it may not be used."""
        assert self.public_key is not None
        found = self.registry.manifest(f"{entry}.sig")
        if found is None:
            return None
        sig_manifest, _ = found
        layers = sig_manifest.get("layers") or []
        if sig_manifest.get("artifactType") != SIGNATURE_TYPE or len(layers) != 1 or not isinstance(layers[0], dict):
            raise Refused("its signature is not a nodeforge cache signature")
        layer = layers[0]
        try:
            signature = base64.b64decode(str((layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION, "")),
                                         validate=True)
        except ValueError:
            raise Refused("its signature is not base64") from None
        payload = self.registry.blob(str(layer.get("digest", "")))
        if payload is None:
            raise Refused("its statement is missing")
        if not self.public_key.verifies(payload, signature):
            raise Refused(f"its signature does not verify against {self.public_key.path}")
        try:
            said = json.loads(payload)
        except ValueError:
            raise Refused("its statement is not JSON") from None
        if not isinstance(said, dict) or said.get("entry") != entry or said.get("nodeforge-cache") != VERSION:
            raise Refused("the signature is for another entry")
        found = self.registry.manifest(entry)
        if found is None:
            return None
        manifest, digest = found
        config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        if not isinstance(config, dict) or config.get("digest") != said.get("image"):
            raise Refused("its content is not what was signed (another image under the same key)")
        return str(said["image"]), manifest, digest

    # --- writing --------------------------------------------------------------------------------
    def store(self, c: docker.DockerClient, local_ref: str, entry: str, image: str, built: bool = True) -> None:
        """Push local_ref as the entry, then its signature; an entry found locally (built False) only
        where the registry has no signature for it yet."""
        if self.down or self.signing is None:
            return
        remote = f"{self.location}:{entry}"
        try:
            if not built and self.registry.has_manifest(f"{entry}.sig"):
                return
            info = c.api.inspect_image(local_ref)
            image_id, diff_ids = info["Id"], list((info.get("RootFS") or {}).get("Layers") or [])
            c.api.tag(local_ref, str(self.location), entry)
            try:
                with _stall_limit(c):
                    statuses = _layer_statuses(c.api.push(str(self.location), tag=entry, stream=True, decode=True),
                                               f"registry {self.location.host}: pushing {entry}")
            finally:
                try:
                    c.api.remove_image(remote)
                except docker.errors.APIError:
                    pass
            found = self.registry.manifest(entry)
            if found is None:
                raise RegistryFault(f"registry {self.location.host}: {entry} is not there after its push")
            manifest, _ = found
            if (manifest.get("config") or {}).get("digest") != image_id:
                raise RegistryFault(f"registry {self.location.host}: {entry} changed while it was pushed")
            said = statement(entry, image_id)
            signature = self.signing.sign(said)
            empty = self.registry.put_blob(b"{}")
            said_digest = self.registry.put_blob(said)
            self.registry.put_manifest(f"{entry}.sig", {
                "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SIGNATURE_TYPE,
                "config": {"mediaType": EMPTY_TYPE, "digest": empty, "size": 2},
                "layers": [{"mediaType": STATEMENT_TYPE, "digest": said_digest, "size": len(said),
                            "annotations": {SIGNATURE_ANNOTATION: base64.b64encode(signature).decode()}}]})
        except RegistryFault as e:
            self._fault(image, e)
            return
        except docker.errors.APIError as e:
            self._fault(image, RegistryFault(f"registry {self.location.host}: the engine could not push {entry}: "
                                             f"{e.explanation or e}"))
            return
        with self._lock:
            self.figures.pushed += 1
            self.figures.bytes_pushed += _moved_bytes(manifest, statuses, ("Pushed",), diff_ids)


def _in_engine(c: docker.DockerClient, ref: str) -> bool:
    try:
        c.api.inspect_image(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def have(c: docker.DockerClient, shared: SharedCache | None, ref: str, kind: str, key: str, image: str) -> str | None:
    """Whether the keyed image ref needs no build: "cached" (in the engine; pushed too where the
    fleet cache lacks it and this build signs), "pulled" (from the fleet cache, verified) or None."""
    entry = entry_name(kind, key)
    if _in_engine(c, ref):
        if shared is not None:
            shared.store(c, ref, entry, image, built=False)
        return "cached"
    if shared is not None and shared.fetch(c, ref, entry, image):
        return "pulled"
    return None


def built(c: docker.DockerClient, shared: SharedCache | None, ref: str, kind: str, key: str, image: str) -> None:
    """A keyed image this build made: into the fleet cache (when it signs)."""
    if shared is not None:
        shared.store(c, ref, entry_name(kind, key), image)
