"""DRA on the 1.20.2 API server, which serves no `resource.k8s.io`: CustomResourceDefinitions standing in for the
group's four kinds, and a proxy standing in for the one thing a CRD cannot give back, the pods' `spec.resourceClaims`.

The CRDs carry upstream's schema (`kubernetes/api` `resource/v1/types.go`, 1.34) for the fields kubegpu writes and
reads, with upstream's bounds (128 devices per slice, 32 attributes and capacities per device, attribute strings of
at most 64 characters, 256 consumers in `reservedFor`, 32 results in an allocation), scopes (DeviceClass and
ResourceSlice cluster-wide, ResourceClaim and ResourceClaimTemplate namespaced) and ResourceClaim's `status`
subresource, so the list, watch and write paths meet what a 1.34 server would accept. Capacity values are strings
here (upstream: int-or-string quantities; this 1.20.2 binary, built with Go 1.19, crashes building the OpenAPI model
of an int-or-string property, and kubegpu writes quantities as strings). The group is a protected one (`*.k8s.io`):
the `api-approved.kubernetes.io` annotation says this is a stand-in.

1.20.2 prunes `spec.resourceClaims` from every pod it stores. `PodClaimsProxy` sits between the scheduler under test
and the API server, passing every request through untouched except pod reads (GET, list and watch), where it puts
back the claims the test wrote in the pod's `CLAIMS_ANNOTATION`: what a 1.34 server would have returned. Everything
else (the claims' creation, status writes, deletion, the Bindings) is the real server's.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import urllib3

from kubegpu.kube.client import ApiError

from .cluster import TOKEN, Cluster, wait_for

__all__ = ["CLAIMS_ANNOTATION", "PodClaimsProxy", "dra_api", "install", "uninstall"]

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CLAIMS_ANNOTATION = "test.kubegpu.io/resource-claims"
PODS = re.compile(r"^/api/v1/(namespaces/[^/]+/)?pods(/[^/]+)?$")

_PRESERVED: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_ATTRIBUTE = {
    "type": "object",
    "properties": {
        "int": {"type": "integer", "format": "int64"},
        "bool": {"type": "boolean"},
        "string": {"type": "string", "maxLength": 64},
        "version": {"type": "string", "maxLength": 64},
    },
    "minProperties": 1,
    "maxProperties": 1,
}
_CAPACITY = {"type": "object", "required": ["value"], "properties": {"value": {"type": "string"}}}
_DEVICE = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 63},
        "attributes": {"type": "object", "maxProperties": 32, "additionalProperties": _ATTRIBUTE},
        "capacity": {"type": "object", "maxProperties": 32, "additionalProperties": _CAPACITY},
    },
}
_SELECTORS = {
    "type": "array",
    "maxItems": 32,
    "items": {
        "type": "object",
        "properties": {
            "cel": {
                "type": "object",
                "required": ["expression"],
                "properties": {"expression": {"type": "string", "maxLength": 10240}},
            }
        },
    },
}
_CONFIG = {"type": "array", "maxItems": 32, "items": _PRESERVED}
_CLAIM_SPEC = {
    "type": "object",
    "properties": {
        "devices": {
            "type": "object",
            "properties": {
                "requests": {
                    "type": "array",
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "maxLength": 63},
                            "exactly": {
                                "type": "object",
                                "required": ["deviceClassName"],
                                "properties": {
                                    "deviceClassName": {"type": "string", "maxLength": 253},
                                    "selectors": _SELECTORS,
                                    "allocationMode": {"type": "string", "enum": ["ExactCount", "All"]},
                                    "count": {"type": "integer", "format": "int64"},
                                    "adminAccess": {"type": "boolean"},
                                },
                            },
                            "firstAvailable": {"type": "array", "maxItems": 8, "items": _PRESERVED},
                        },
                    },
                },
                "constraints": {"type": "array", "maxItems": 32, "items": _PRESERVED},
                "config": _CONFIG,
            },
        }
    },
}
_CLAIM_STATUS = {
    "type": "object",
    "properties": {
        "allocation": {
            "type": "object",
            "properties": {
                "devices": {
                    "type": "object",
                    "properties": {
                        "results": {
                            "type": "array",
                            "maxItems": 32,
                            "items": {
                                "type": "object",
                                "required": ["request", "driver", "pool", "device"],
                                "properties": {
                                    "request": {"type": "string"},
                                    "driver": {"type": "string", "maxLength": 63},
                                    "pool": {"type": "string", "maxLength": 253},
                                    "device": {"type": "string", "maxLength": 63},
                                    "adminAccess": {"type": "boolean"},
                                },
                            },
                        },
                        "config": {"type": "array", "maxItems": 64, "items": _PRESERVED},
                    },
                },
                "nodeSelector": _PRESERVED,
            },
        },
        "reservedFor": {
            "type": "array",
            "maxItems": 256,
            "items": {
                "type": "object",
                "required": ["resource", "name", "uid"],
                "properties": {
                    "apiGroup": {"type": "string"},
                    "resource": {"type": "string"},
                    "name": {"type": "string"},
                    "uid": {"type": "string"},
                },
            },
        },
    },
}
_SLICE_SPEC = {
    "type": "object",
    "required": ["driver", "pool"],
    "properties": {
        "driver": {"type": "string", "maxLength": 63},
        "pool": {
            "type": "object",
            "required": ["name", "generation", "resourceSliceCount"],
            "properties": {
                "name": {"type": "string", "maxLength": 253},
                "generation": {"type": "integer", "format": "int64"},
                "resourceSliceCount": {"type": "integer", "format": "int64"},
            },
        },
        "nodeName": {"type": "string"},
        "nodeSelector": _PRESERVED,
        "allNodes": {"type": "boolean"},
        "devices": {"type": "array", "maxItems": 128, "items": _DEVICE},
    },
}


def _schema(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
    }
    if status is not None:
        properties["status"] = status
    return {"type": "object", "properties": properties}


KINDS: dict[str, tuple[str, str, dict[str, Any], bool]] = {
    # plural: kind, scope, schema, status subresource
    "deviceclasses": (
        "DeviceClass",
        "Cluster",
        _schema({"type": "object", "properties": {"selectors": _SELECTORS, "config": _CONFIG}}),
        False,
    ),
    "resourceslices": ("ResourceSlice", "Cluster", _schema(_SLICE_SPEC), False),
    "resourceclaimtemplates": (
        "ResourceClaimTemplate",
        "Namespaced",
        _schema({"type": "object", "properties": {"metadata": _PRESERVED, "spec": _CLAIM_SPEC}}),
        False,
    ),
    "resourceclaims": ("ResourceClaim", "Namespaced", _schema(_CLAIM_SPEC, _CLAIM_STATUS), True),
}


def crd(plural: str) -> dict[str, Any]:
    kind, scope, schema, status = KINDS[plural]
    version: dict[str, Any] = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.resource.k8s.io",
            "annotations": {"api-approved.kubernetes.io": "unapproved, a test stand-in for resource.k8s.io/v1"},
        },
        "spec": {
            "group": "resource.k8s.io",
            "scope": scope,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [version],
        },
    }


def install(cluster: Cluster, *plurals: str) -> None:
    """Create the CRDs and wait until the group serves each of them."""
    for plural in plurals:
        with contextlib.suppress(ApiError):  # left by an earlier test that failed before its cleanup
            cluster.client.post(CRD_PATH, crd(plural))

    def served() -> bool:
        try:
            listed = cluster.client.get("/apis/resource.k8s.io/v1")
        except ApiError:  # the discovery document appears once a CRD is established
            return False
        names = {r.get("name") for r in listed.get("resources", [])}
        return all(p in names for p in plurals) and all(
            cluster.client.get(f"/apis/resource.k8s.io/v1/{p}") is not None for p in plurals
        )

    wait_for(served, 30, f"resource.k8s.io/v1 {', '.join(plurals)} served")


def uninstall(cluster: Cluster, *plurals: str) -> None:
    """Delete the CRDs (and so every object of them) and wait until the group is no longer served: other tests'
    advertisers and schedulers must not see it."""
    for plural in plurals:
        # Claims keep the scheduler's finalizer while allocated, and no scheduler runs now to release them.
        with contextlib.suppress(ApiError):
            for item in cluster.client.list(f"/apis/resource.k8s.io/v1/{plural}")[0]:
                meta = item["metadata"]
                if meta.get("finalizers"):
                    where = f"namespaces/{meta['namespace']}/" if meta.get("namespace") else ""
                    path = f"/apis/resource.k8s.io/v1/{where}{plural}/{meta['name']}"
                    cluster.client.patch(path, {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiError):
            cluster.client.delete(f"{CRD_PATH}/{plural}.resource.k8s.io")

    def gone() -> bool:
        try:
            cluster.client.get("/apis/resource.k8s.io")
        except ApiError:
            return True
        return False

    wait_for(gone, 60, "resource.k8s.io no longer served")


@contextlib.contextmanager
def dra_api(cluster: Cluster, *plurals: str) -> Iterator[None]:
    install(cluster, *plurals)
    try:
        yield
    finally:
        uninstall(cluster, *plurals)


# -- the proxy ----------------------------------------------------------------------------------------------------


def with_claims(obj: Any) -> Any:
    """A pod as a 1.34 server would return it: its `spec.resourceClaims` from `CLAIMS_ANNOTATION`."""
    if isinstance(obj, dict) and isinstance(obj.get("spec"), dict):
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(CLAIMS_ANNOTATION)
        if raw:
            obj["spec"]["resourceClaims"] = orjson.loads(raw)
    return obj


class PodClaimsProxy:
    """Plain HTTP on a loopback port in front of the cluster's API server (`url`, `kubeconfig` for a client)."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        upstream = urllib3.PoolManager(num_pools=2, maxsize=64, cert_reqs="CERT_NONE", retries=False)
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        target = cluster.url

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                path, _, query = self.path.partition("?")
                pods = self.command == "GET" and PODS.match(path) is not None
                watch = "watch=true" in query
                response = upstream.request(
                    self.command,
                    target + self.path,
                    body=body,
                    headers=headers,
                    preload_content=False,
                    timeout=urllib3.Timeout(connect=5.0, read=None if watch else 60.0),
                )
                self.send_response(response.status)
                content_type = response.headers.get("Content-Type", "application/json")
                self.send_header("Content-Type", content_type)
                if watch and response.status == 200:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self._stream(response, pods)
                    return
                data = response.read()
                response.release_conn()
                if pods and response.status == 200:
                    document = orjson.loads(data)
                    for item in document.get("items") or ():
                        with_claims(item)
                    data = orjson.dumps(with_claims(document))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, response: Any, pods: bool) -> None:
                buffer = b""
                try:
                    for chunk in response.stream(65536):
                        buffer += chunk
                        lines = buffer.split(b"\n")
                        buffer = lines.pop()
                        out = b""
                        for line in lines:
                            if not line.strip():
                                continue
                            if pods:
                                event = orjson.loads(line)
                                with_claims(event.get("object"))
                                line = orjson.dumps(event)
                            out += line + b"\n"
                        if out:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(out), out))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (OSError, urllib3.exceptions.HTTPError):
                    self.close_connection = True
                finally:
                    response.release_conn()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.kubeconfig = workdir / "proxy-kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: proxy\n  cluster:\n    server: {self.url}\n"
            f"users:\n- name: user\n  user:\n    token: {TOKEN}\n"
            "contexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: user\n"
            "current-context: proxy\n"
        )
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PodClaimsProxy:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
