"""`kubegpu scheduler` when the real API server refuses its Bindings: a validating admission webhook (a policy
engine's, say) denies `pods/binding` in one namespace. kube-scheduler tells the pod's owner "binding rejected" with
the webhook's reason; so must kubegpu, once, while it keeps retrying with backoff and without holding the devices.

The webhook is a small HTTPS server in the test process, registered with `failurePolicy: Ignore` and removed after
the test, so the cluster the other tests share is left as it was.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from base64 import b64encode
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster, wait_for
from .test_scheduler import P3, bound

NAME = "refused-writes"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
DENIAL = "bindings in this namespace are frozen by policy FREEZE-7"


class Denier(BaseHTTPRequestHandler):
    """Answers AdmissionReviews: a Binding in the frozen namespace is denied with `DENIAL`, anything else allowed."""

    frozen = ""
    asked = 0

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        denied = request.get("namespace") == Denier.frozen
        Denier.asked += denied
        response: dict[str, Any] = {"uid": request["uid"], "allowed": not denied}
        if denied:
            response["status"] = {"code": 403, "message": DENIAL}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def denying_webhook(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[None]:
    key, cert = tmp_path / "webhook.key", tmp_path / "webhook.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    Denier.frozen, Denier.asked = namespace, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Denier)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    name = f"deny-bindings-{namespace}"[:63]
    cluster.client.post(
        WEBHOOKS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "deny-bindings.kubegpu.test",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{server.server_address[1]}/validate",
                        "caBundle": b64encode(cert.read_bytes()).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/binding"],
                        }
                    ],
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        },
    )
    try:
        yield
    finally:
        cluster.client.delete(f"{WEBHOOKS}/{name}")
        server.shutdown()


def failed_scheduling(cluster: Cluster, namespace: str, pod: str) -> list[str]:
    return [
        e.get("message") or e.get("note") or ""
        for e in cluster.events(namespace)
        if e["involvedObject"]["name"] == pod and e["reason"] == "FailedScheduling"
    ]


def test_a_binding_refused_by_an_admission_webhook_tells_the_pod_why_once_and_keeps_retrying(
    cluster: Cluster, namespace: str, start_scheduler: Any, denying_webhook: None
) -> None:
    """The pod used to stay Pending with nothing on it (no Event, no condition) while the scheduler retried every
    10 s: the reason was in the scheduler's log only, which tenants do not read."""
    cluster.create_ready_node("p3-refused", labels=P3, allocatable={"nvidia.com/gpu": 8})
    scheduler = start_scheduler(NAME, "--no-leader-elect")
    cluster.create_pod(namespace, "frozen", {"main": {"nvidia.com/gpu": 8}}, scheduler=NAME)
    wait_for(lambda: Denier.asked >= 3, 30, "the scheduler to try the Binding three times")
    assert "frozen" not in bound(cluster, namespace)
    messages = failed_scheduling(cluster, namespace, "frozen")
    assert len(messages) == 1 and DENIAL in messages[0] and "binding rejected" in messages[0], messages
    pod = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/frozen")
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert condition["status"] == "False" and condition["reason"] == "SchedulerError", condition
    assert DENIAL in condition["message"]
    # The policy is lifted: the pod binds at its next retry, its 8 GPUs free all along (no reservation leaked).
    Denier.frozen = "none"
    wait_for(lambda: "frozen" in bound(cluster, namespace), 30, "the pod to bind once the webhook allows it")
    assert scheduler.process.poll() is None
