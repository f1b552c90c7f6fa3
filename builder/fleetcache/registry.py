"""The few calls of the OCI distribution API the fleet cache needs, over the standard library:
read a manifest or a blob, upload a blob, put a manifest under a tag. Every failure (refused
connection, timeout, an HTTP error other than 404, an answer that is not what the API says) is a
RegistryFault naming the registry and the call."""

from __future__ import annotations

import hashlib
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
ACCEPT = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST))
MAX_MANIFEST = 4 << 20
MAX_BLOB = 1 << 20  # what this client reads whole: statements and signatures, never layers
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


class RegistryFault(Exception):
    """The registry could not be used for one call: the build goes on without it (or stops with
    --cache-required)."""


@dataclass(frozen=True)
class Location:
    """REGISTRY/REPO of a cache: host[:port] and the repository path in it."""

    host: str
    repo: str

    @classmethod
    def parse(cls, value: str) -> Location:
        host, _, repo = value.partition("/")
        return cls(host, repo)

    def __str__(self) -> str:
        return f"{self.host}/{self.repo}"

    @property
    def base_url(self) -> str:
        hostname = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else self.host.split("]")[0] + "]"
        scheme = "http" if hostname in LOCAL_HOSTS else "https"  # as the engine treats 127.0.0.0/8 and localhost
        return f"{scheme}://{self.host}/v2/{self.repo}"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    def __init__(self, location: Location, timeout: float = 10.0) -> None:
        self.location, self.timeout = location, timeout

    def _call(self, method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
              limit: int = MAX_MANIFEST) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        what = f"{method} {urllib.parse.urlsplit(url).path}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                body = answer.read(limit + 1)
                if len(body) > limit:
                    raise RegistryFault(f"registry {self.location.host}: {what}: answer larger than {limit} bytes")
                return answer.status, dict(answer.headers.items()), body
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return 404, {}, b""
            raise RegistryFault(f"registry {self.location.host}: {what}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RegistryFault(f"registry {self.location.host}: {what}: {reason}") from None

    def manifest(self, reference: str) -> tuple[dict[str, Any], str] | None:
        """(the manifest, its digest) of a tag or digest; None where there is none."""
        status, _, body = self._call("GET", f"{self.location.base_url}/manifests/{reference}",
                                     headers={"Accept": ACCEPT})
        if status == 404:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            raise RegistryFault(f"registry {self.location.host}: manifest {reference} is not JSON") from None
        if not isinstance(data, dict):
            raise RegistryFault(f"registry {self.location.host}: manifest {reference} is not a JSON object")
        return data, sha256_digest(body)

    def has_manifest(self, reference: str) -> bool:
        status, _, _ = self._call("HEAD", f"{self.location.base_url}/manifests/{reference}",
                                  headers={"Accept": ACCEPT})
        return status != 404

    def blob(self, digest: str, limit: int = MAX_BLOB) -> bytes | None:
        status, _, body = self._call("GET", f"{self.location.base_url}/blobs/{digest}", limit=limit)
        if status == 404:
            return None
        if sha256_digest(body) != digest:
            raise RegistryFault(f"registry {self.location.host}: blob {digest[:19]} has other content than its digest")
        return body

    def put_blob(self, data: bytes) -> str:
        digest = sha256_digest(data)
        status, headers, _ = self._call("POST", f"{self.location.base_url}/blobs/uploads/", data=b"")
        where = headers.get("Location") or headers.get("location")
        if status != 202 or not where:
            raise RegistryFault(f"registry {self.location.host}: blob upload not started (HTTP {status})")
        url = urllib.parse.urljoin(self.location.base_url + "/", where)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        status, _, _ = self._call("PUT", url, data=data, headers={"Content-Type": "application/octet-stream"})
        if status != 201:
            raise RegistryFault(f"registry {self.location.host}: blob {digest[:19]} not stored (HTTP {status})")
        return digest

    def put_manifest(self, tag: str, manifest: dict[str, Any]) -> str:
        body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
        status, _, _ = self._call("PUT", f"{self.location.base_url}/manifests/{tag}", data=body,
                                  headers={"Content-Type": manifest.get("mediaType", OCI_MANIFEST)})
        if status != 201:
            raise RegistryFault(f"registry {self.location.host}: manifest {tag} not stored (HTTP {status})")
        return sha256_digest(body)
