"""`kubegpu extender` behind the real kube-scheduler 1.20.2, over HTTP and HTTPS, and its endpoints under abuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, verify_allocation

from .cluster import Cluster, free_port, wait_for
from .test_scheduler import INTEL, P3, SEVEN, TRN1, bound, wait_bound

MANAGED = [
    "aws.amazon.com/neuron",
    "aws.amazon.com/neurondevice",
    "aws.amazon.com/neuroncore",
    "gpu.intel.com/i915",
    "gpu.intel.com/memory.max",
    "nvidia.com/gpu",
]


class Process:
    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def extender_stack(
    cluster: Cluster, key_file: Path, tmp_path: Path
) -> Iterator[Callable[..., tuple[str, Process, Process]]]:
    """Start `kubegpu extender` and a kube-scheduler whose profile `gpu-scheduler` calls it."""
    started: list[Process] = []

    def start(https: bool) -> tuple[str, Process, Process]:
        port = free_port()
        command = [sys.executable, "-m", "kubegpu", "extender", "--kubeconfig", str(cluster.kubeconfig),
                   "--listen", f"127.0.0.1:{port}", "--allocation-key-file", str(key_file)]  # fmt: skip
        tls = ""
        scheme = "http"
        if https:
            cert, key = self_signed(tmp_path)
            command += ["--tls-cert", str(cert), "--tls-key", str(key)]
            tls = f"  tlsConfig:\n    caFile: {cert}\n"
            scheme = "https"
        url = f"{scheme}://127.0.0.1:{port}"
        extender = Process(command, tmp_path / "extender.log")
        started.append(extender)
        http = urllib3.PoolManager(cert_reqs="CERT_NONE")
        urllib3.disable_warnings()
        assert wait_for(lambda: http.request("GET", f"{url}/healthz", timeout=1.0).status, 30, "the extender") == 200
        # Ready (503 until then) once its informers have listed the nodes and pods.
        wait_for(lambda: http.request("GET", f"{url}/readyz", timeout=1.0).status == 200, 30, "the extender's sync")
        resources = "".join(f"  - name: {r}\n    ignoredByScheduler: false\n" for r in MANAGED)
        config = tmp_path / "scheduler.yaml"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
            f"clientConnection:\n  kubeconfig: {cluster.kubeconfig}\n  qps: 1000\n  burst: 1000\n"
            "leaderElection:\n  leaderElect: false\n"
            "profiles:\n- schedulerName: gpu-scheduler\n"
            f"extenders:\n- urlPrefix: {url}\n  filterVerb: filter\n  prioritizeVerb: prioritize\n"
            "  bindVerb: bind\n  preemptVerb: preempt\n  weight: 1\n"
            f"  enableHTTPS: {str(https).lower()}\n  nodeCacheCapable: true\n  ignorable: false\n"
            f"  managedResources:\n{resources}{tls}"
        )
        scheduler = Process(
            [str(cluster.bin / "kube-scheduler"), f"--config={config}", "--port=0", f"--secure-port={free_port()}",
             "--bind-address=127.0.0.1", f"--cert-dir={tmp_path / 'ks-certs'}",
             "--authentication-tolerate-lookup-failure", "-v=2"],
            tmp_path / "kube-scheduler.log",
        )  # fmt: skip
        started.append(scheduler)
        return url, extender, scheduler

    yield start
    for process in started:
        process.stop()


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_kube_scheduler_binds_device_pods_through_the_extender(
    https: bool, cluster: Cluster, namespace: str, extender_stack: Any, key_file: Path
) -> None:
    cluster.create_ready_node("trn1-x", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    cluster.create_ready_node("p3-x", labels=P3, allocatable={"nvidia.com/gpu": 8})
    cluster.create_ready_node(
        "intel-x", labels=INTEL, allocatable={"gpu.intel.com/i915": 8, "gpu.intel.com/memory.max": "16G"}
    )
    _, extender, scheduler = extender_stack(https)
    pods = {
        "torus-4": {"main": {"aws.amazon.com/neurondevice": 4}},
        "gpu-2": {"main": {"nvidia.com/gpu": 2}},
        "media": {"encode": {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "5G"}},
        "torus-8": {"main": {"aws.amazon.com/neurondevice": 8}},
    }
    for name, containers in pods.items():
        cluster.create_pod(namespace, name, containers, scheduler="gpu-scheduler")
    try:
        placed = wait_bound(cluster, namespace, len(pods), timeout=60)
    except AssertionError:
        raise AssertionError(f"{extender.output()[-3000:]}\n---\n{scheduler.output()[-3000:]}") from None
    key = key_file.read_text().strip().encode()
    devices: dict[str, list[str]] = {}
    for name, pod in placed.items():
        record = decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY])
        assert verify_allocation(record, key) and record.node == pod["spec"]["nodeName"]
        devices[name] = next(iter(next(iter(record.containers.values())).values()))
    assert devices["torus-4"] in ([str(i) for i in range(r, r + 4)] for r in (0, 4, 8, 12))
    assert devices["torus-8"] in ([str(i) for i in range(8)], [str(i) for i in range(8, 16)])
    assert not set(devices["torus-4"]) & set(devices["torus-8"])
    assert placed["media"]["metadata"]["annotations"]["gas-container-cards"] in ("card0", "card1")

    # An empty trn1 passes kube-scheduler's own resource check for 7 devices; kubegpu refuses the shape.
    cluster.create_ready_node("trn1-y", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    cluster.create_pod(namespace, "seven", {"main": {"aws.amazon.com/neurondevice": 7}}, scheduler="gpu-scheduler")

    def refusal() -> str | None:
        events = [e for e in cluster.events(namespace) if e["involvedObject"]["name"] == "seven"]
        return next((e["message"] for e in events if e["reason"] == "FailedScheduling" and SEVEN in e["message"]), None)

    # kube-scheduler retries when it learns of the new node, so wait for the event that carries kubegpu's reason.
    message = wait_for(refusal, 60, "kube-scheduler's FailedScheduling event with kubegpu's reason")
    assert message.startswith("0/4 nodes are available: "), message
    assert "seven" not in bound(cluster, namespace)


def test_the_monitoring_api_lists_and_watches_holders(cluster: Cluster, namespace: str, extender_stack: Any) -> None:
    cluster.create_ready_node("p3-y", labels=P3, allocatable={"nvidia.com/gpu": 8})
    url, _, _ = extender_stack(False)
    http = urllib3.PoolManager()
    watch = http.request("GET", f"{url}/apis/kubegpu/v1/pods?watch=true", preload_content=False, timeout=30)
    cluster.create_pod(namespace, "watched", {"main": {"nvidia.com/gpu": 4}}, scheduler="gpu-scheduler")
    wait_bound(cluster, namespace, 1, timeout=60)
    buffer = b""
    for chunk in watch.stream(1024):
        buffer += chunk
        if b"\n" in buffer:
            break
    watch.release_conn()
    event = json.loads(buffer.split(b"\n")[0])
    assert event["type"] == "ADDED" and event["object"]["pod"] == f"{namespace}/watched"
    assert sorted(event["object"]["devices"]["main"]["nvidia.com/gpu"]) in (["0", "1", "2", "3"], ["4", "5", "6", "7"])
    nodes = orjson.loads(http.request("GET", f"{url}/apis/kubegpu/v1/nodes").data)["items"]
    p3 = next(n for n in nodes if n["name"] == "p3-y")
    assert p3["pods"] == [f"{namespace}/watched"]
    assert sum(1 for cell in p3["devices"][0]["cells"] if cell["holders"]) == 4


quantities = st.one_of(
    st.integers(-(10**12), 10**12).map(str), st.sampled_from(["1e400", "-1", "lots", "", "1Ki", "0"])
)
pods = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": st.text(min_size=0, max_size=8)}),
     "spec": st.fixed_dictionaries({"containers": st.lists(st.fixed_dictionaries({
         "name": st.text(min_size=1, max_size=5),
         "resources": st.fixed_dictionaries({"limits": st.dictionaries(st.sampled_from(MANAGED), quantities,
                                                                        max_size=3)})}), max_size=2)})})  # fmt: skip
bodies = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda pod, names: {"Pod": pod, "NodeNames": names}, pods, st.lists(st.text(max_size=10), max_size=5)),
    st.builds(lambda pod: {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": "ghost"}}]}}, pods),
    st.builds(lambda name, node: {"PodName": name, "PodNamespace": "nowhere", "PodUID": "x", "Node": node},
              st.text(max_size=10), st.text(max_size=10)),
    st.builds(lambda pod, uid: {"Pod": pod, "NodeNameToMetaVictims": {"ghost": {"Pods": [{"UID": uid}]}}},
              pods, st.text(max_size=5)),
    st.just([1, 2, 3]),
    st.just({"Pod": "not an object"}),
)  # fmt: skip


def test_the_endpoints_survive_malformed_and_hostile_bodies(
    cluster: Cluster, namespace: str, extender_stack: Any
) -> None:
    cluster.create_ready_node("trn1-z", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    url, extender, _ = extender_stack(False)
    http = urllib3.PoolManager(retries=False)
    seen: set[int] = set()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]), body=bodies)
    def fuzz(verb: str, body: Any) -> None:
        payload = body if isinstance(body, bytes) else orjson.dumps(body)
        response = http.request("POST", f"{url}/{verb}", body=payload, headers={"Content-Type": "application/json"})
        seen.add(response.status)
        assert response.status < 500, (verb, body, response.data)
        document = orjson.loads(response.data)  # always JSON, never a traceback page
        assert "Traceback" not in response.data.decode()
        if response.status >= 400:
            assert isinstance(document, dict) and document["error"]

    fuzz()
    oversized = http.request(
        "POST", f"{url}/filter", body=b"{}", headers={"Content-Length": str(10**10), "Content-Type": "application/json"}
    )
    assert oversized.status == 413
    assert {200, 400} <= seen
    # Still serving, with the node it knew before the abuse.
    seven = {"limits": {"aws.amazon.com/neurondevice": "7"}}
    body = {"Pod": {"metadata": {"name": "ok", "namespace": namespace},
                    "spec": {"containers": [{"name": "c", "resources": seven}]}}, "NodeNames": ["trn1-z"]}  # fmt: skip
    filtered = orjson.loads(http.request("POST", f"{url}/filter", body=orjson.dumps(body)).data)
    assert SEVEN in filtered["FailedAndUnresolvableNodes"]["trn1-z"]
    assert extender.process.poll() is None
