"""A real Kubernetes control plane for tests and benchmarks: etcd and kube-apiserver on loopback ports.

The binaries come from `scripts/k8s-binaries.sh` (built once from Debian's `kubernetes` source package and cached
outside the clone); its cache directory is found through `KUBEGPU_K8S_BIN` or the script's default. Nothing here
skips: when a binary is missing or the server does not come up, `ClusterError` says what is missing.

No kubelet and no controller-manager run, so the helpers do their parts: `create_ready_node` creates a Node, marks
it Ready with the given capacity and removes the `node.kubernetes.io/not-ready` taint; pods are deleted with a zero
grace period (nobody else would confirm the deletion).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import urllib3

from kubegpu.kube.client import ApiError, Credentials, KubeClient

__all__ = ["Cluster", "ClusterError", "free_port", "process", "wait_for"]

TOKEN = "kubegpu-test-admin-token"


class ClusterError(RuntimeError):
    """The test control plane could not start; the message says what is missing."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config_flag(path: Path) -> str:
    """kube-scheduler's `--config=PATH`, the file given an insecure port of its own first (unless it names one).
    With a configuration file, kube-scheduler 1.20 ignores `--port=0` and serves healthz and metrics where the file
    says, 0.0.0.0:10251 by default: one left running anywhere on the machine made every other refuse to start."""
    text = path.read_text()
    if "healthzBindAddress" not in text and "metricsBindAddress" not in text:
        port = free_port()
        ending = "" if text.endswith("\n") else "\n"
        path.write_text(f"{text}{ending}healthzBindAddress: 127.0.0.1:{port}\nmetricsBindAddress: 127.0.0.1:{port}\n")
    return f"--config={path}"


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            last_error = exc
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def unreachable_kubeconfig(folder: Path) -> Path:
    """A kubeconfig naming an API server nobody listens on, for a kube-scheduler that only writes its configuration
    (`--write-config-to`) and never connects."""
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: unused}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    return kubeconfig


def binary_dir() -> Path:
    configured = os.environ.get("KUBEGPU_K8S_BIN")
    directory = Path(configured) if configured else Path.home() / ".cache" / "kubegpu" / "k8s-1.20.2"
    for binary in ("kube-apiserver", "kube-scheduler"):
        if not (directory / binary).exists():
            raise ClusterError(
                f"{directory / binary} is missing: run scripts/k8s-binaries.sh (the README's test command does) "
                "or point KUBEGPU_K8S_BIN at a directory holding kube-apiserver and kube-scheduler 1.20"
            )
    if shutil.which("etcd") is None:
        raise ClusterError("etcd is not on PATH: install Debian's etcd-server (scripts/k8s-binaries.sh does)")
    return directory


class Cluster:
    """etcd + kube-apiserver in `workdir`, with an admin token and a kubeconfig."""

    def __init__(self, workdir: Path, *apiserver_flags: str) -> None:
        self.workdir = workdir
        self.apiserver_flags = apiserver_flags  # beyond the usual ones (`--runtime-config` to turn an API off)
        self.bin = binary_dir()
        self.etcd_port, self.peer_port, self.port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = workdir / "kubeconfig"
        self.etcd: subprocess.Popen[bytes] | None = None
        self.apiserver: subprocess.Popen[bytes] | None = None
        self.client = KubeClient(Credentials(self.url, None, None, None, False, f"Bearer {TOKEN}"))

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def _prepare(self) -> None:
        (self.workdir / "certs").mkdir(parents=True, exist_ok=True)
        (self.workdir / "tokens.csv").write_text(f'{TOKEN},kubegpu-admin,kubegpu-admin,"system:masters"\n')
        key = self.workdir / "sa.key"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(
                ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(self.workdir / "sa.pub")],
                check=True,
                capture_output=True,
            )
        self.write_kubeconfig(self.kubeconfig, TOKEN)

    def write_kubeconfig(self, path: Path, token: str) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: test\n  cluster:\n    server: {self.url}\n    insecure-skip-tls-verify: true\n"
            f"users:\n- name: user\n  user:\n    token: {token}\n"
            "contexts:\n- name: test\n  context:\n    cluster: test\n    user: user\n"
            "current-context: test\n"
        )
        return path

    def start(self) -> None:
        self._prepare()
        self.start_etcd()
        self.start_apiserver()

    def start_etcd(self) -> None:
        log = (self.workdir / "etcd.log").open("ab")
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.etcd = subprocess.Popen(
            [
                "etcd",
                "--name=kubegpu-test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=kubegpu-test={peer}",
                "--log-level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start_apiserver(self, timeout: float = 60.0) -> None:
        log = (self.workdir / "apiserver.log").open("ab")
        self.apiserver = subprocess.Popen(
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--secure-port={self.port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--cert-dir={self.workdir / 'certs'}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                f"--service-account-key-file={self.workdir / 'sa.pub'}",
                f"--service-account-signing-key-file={self.workdir / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                "--v=0",
                *self.apiserver_flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            if self.apiserver is not None and self.apiserver.poll() is not None:
                tail = (self.workdir / "apiserver.log").read_text(errors="replace")[-3000:]
                raise ClusterError(f"kube-apiserver exited with {self.apiserver.returncode}:\n{tail}")
            response = self.client.pool.request(
                "GET", f"{self.url}/readyz", headers=self.client.headers, timeout=urllib3.Timeout(2.0)
            )
            return response.status == 200

        try:
            wait_for(ready, timeout, "kube-apiserver /readyz", interval=0.25)
        except AssertionError as exc:
            tail = (self.workdir / "apiserver.log").read_text(errors="replace")[-3000:]
            raise ClusterError(f"{exc}\n{tail}") from None

    def stop_apiserver(self) -> None:
        _terminate(self.apiserver)
        self.apiserver = None

    def stop(self) -> None:
        self.stop_apiserver()
        _terminate(self.etcd)
        self.etcd = None

    # -- helpers a test uses ------------------------------------------------------------------------------------

    def create_namespace(self, name: str) -> str:
        with contextlib.suppress(ApiError):
            self.client.post(
                "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        return name

    def create_ready_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str | int] | None = None,
    ) -> dict[str, Any]:
        """A Node as a kubelet would leave it: Ready, with capacity and allocatable, without the not-ready taint."""
        resources = {"cpu": "96", "memory": "768Gi", "pods": "250"}
        resources.update({k: str(v) for k, v in (allocatable or {}).items()})
        self.client.post(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            },
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.client.patch(
            f"/api/v1/nodes/{name}/status",
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "fake node",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            },
        )
        node: dict[str, Any] = self.client.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
        return node

    def create_pod(
        self,
        namespace: str,
        name: str,
        containers: Mapping[str, Mapping[str, str | int]],
        *,
        scheduler: str,
        annotations: Mapping[str, str] | None = None,
        node_selector: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "schedulerName": scheduler,
            "containers": [
                {"name": c, "image": "busybox", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}
                for c, limits in containers.items()
            ],
        }
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
            "spec": spec,
        }
        pod: dict[str, Any] = self.client.post(f"/api/v1/namespaces/{namespace}/pods", body)
        return pod

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        items, _ = self.client.list(f"/api/v1/namespaces/{namespace}/pods")
        return items

    def events(self, namespace: str) -> list[dict[str, Any]]:
        items, _ = self.client.list(f"/api/v1/namespaces/{namespace}/events")
        return items

    def delete_pod(self, namespace: str, name: str) -> None:
        self.client.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", params={"gracePeriodSeconds": 0})

    def cleanup(self) -> None:
        """Remove every node and every pod (nothing else would: no kubelet, no controllers)."""
        for pod in self.client.list("/api/v1/pods")[0]:
            meta = pod["metadata"]
            with contextlib.suppress(ApiError):
                self.delete_pod(meta["namespace"], meta["name"])
        for node in self.client.list("/api/v1/nodes")[0]:
            with contextlib.suppress(ApiError):
                self.client.delete(f"/api/v1/nodes/{node['metadata']['name']}")


def _terminate(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@contextlib.contextmanager
def process(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a scheduler (or any command) for the `with` block, its output in `log`; stopped with SIGTERM (as the
    kubelet stops it), killed after 20 s."""
    started = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        yield started
    finally:
        started.send_signal(signal.SIGTERM)
        try:
            started.wait(timeout=20)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait()


@contextlib.contextmanager
def running_cluster(workdir: Path, *apiserver_flags: str) -> Iterator[Cluster]:
    cluster = Cluster(workdir, *apiserver_flags)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
