"""`kubegpu extender` behind the real kube-scheduler 1.20.2: over HTTPS with client certificates (kube-scheduler's
extender tlsConfig) and the shipped RBAC, over plain HTTP when the operator says --insecure-no-client-auth, and its
endpoints under abuse."""

from __future__ import annotations

import contextlib
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
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, verify_allocation
from kubegpu.core.testing import node_manifest
from kubegpu.kube.client import ApiError, AsyncKubeClient, now_rfc3339
from kubegpu.scheduler.extender import UNKNOWN_NODE

from .cluster import Cluster, config_flag, free_port, wait_for
from .test_preemption import create, devices, priority_classes
from .test_preemption import pods as pods_in
from .test_scheduler import (
    HAMI_ALLOCATABLE,
    HAMI_GPU,
    INTEL,
    LATE,
    LATE_REASON,
    P3,
    ROOT,
    SEVEN,
    SHARES,
    TRN1,
    _apply,
    assert_shares_add_up,
    bound,
    create_shares,
    share_refusal,
    wait_bound,
)

DEPLOY = ROOT / "examples" / "deploy" / "extender"

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


def make_certs(directory: Path) -> Path:
    """The shipped script: the extender's CA, its serving certificate for 127.0.0.1, kube-scheduler's client one."""
    subprocess.run(["sh", str(DEPLOY / "make-certs.sh"), str(directory), "127.0.0.1"], check=True, capture_output=True)
    return directory


def extender_kubeconfig(cluster: Cluster, directory: Path) -> Path:
    """A kubeconfig for the ServiceAccount of the shipped extender.yaml, with only the RBAC it grants."""
    documents = list(yaml.safe_load_all((DEPLOY / "extender.yaml").read_text()))
    _apply(cluster, [d for d in documents if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")])
    token = cluster.client.post(
        "/api/v1/namespaces/kube-system/serviceaccounts/kubegpu-extender/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600},
        },
    )["status"]["token"]
    return cluster.write_kubeconfig(directory / "extender.kubeconfig", token)


@pytest.fixture
def extender_stack(
    cluster: Cluster, key_file: Path, tmp_path: Path
) -> Iterator[Callable[..., tuple[str, Process, Process]]]:
    """Start `kubegpu extender` and a kube-scheduler whose profile `gpu-scheduler` calls it. With `https`, the
    extender requires client certificates (`tmp_path / "certs"`: make-certs.sh) and runs with the shipped RBAC."""
    started: list[Process] = []

    def start(https: bool, *extra: str) -> tuple[str, Process, Process]:
        port = free_port()
        kubeconfig = extender_kubeconfig(cluster, tmp_path) if https else cluster.kubeconfig
        command = [sys.executable, "-m", "kubegpu", "extender", "--kubeconfig", str(kubeconfig),
                   "--listen", f"127.0.0.1:{port}", "--allocation-key-file", str(key_file), *extra]  # fmt: skip
        if https:
            certs = make_certs(tmp_path / "certs")
            command += ["--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
                        "--client-ca", str(certs / "ca.crt")]  # fmt: skip
            tls = (f"  tlsConfig:\n    caFile: {certs / 'ca.crt'}\n    certFile: {certs / 'client.crt'}\n"
                   f"    keyFile: {certs / 'client.key'}\n")  # fmt: skip
        else:
            command.append("--insecure-no-client-auth")
            tls = ""
        url = f"{'https' if https else 'http'}://127.0.0.1:{port}"
        extender = Process(command, tmp_path / "extender.log")
        started.append(extender)
        http = urllib3.PoolManager(cert_reqs="CERT_NONE")  # the probes, as the kubelet calls them
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
            [str(cluster.bin / "kube-scheduler"), config_flag(config), "--port=0", f"--secure-port={free_port()}",
             "--bind-address=127.0.0.1", f"--cert-dir={tmp_path / 'ks-certs'}",
             "--authentication-tolerate-lookup-failure", "-v=2"],
            tmp_path / "kube-scheduler.log",
        )  # fmt: skip
        started.append(scheduler)
        return url, extender, scheduler

    yield start
    for process in started:
        process.stop()


def tls_client(certs: Path | None, ca: Path) -> urllib3.PoolManager:
    if certs is None:
        return urllib3.PoolManager(ca_certs=str(ca), retries=False)
    return urllib3.PoolManager(
        ca_certs=str(ca), cert_file=str(certs / "client.crt"), key_file=str(certs / "client.key"), retries=False
    )


def can(cluster: Cluster, verb: str, resource: str, subresource: str = "") -> bool:
    """Whether the shipped extender ServiceAccount may `verb` `resource` in any namespace (SubjectAccessReview)."""
    review = cluster.client.post(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "system:serviceaccount:kube-system:kubegpu-extender",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
                "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource},
            },
        },
    )
    return bool(review["status"].get("allowed"))


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_kube_scheduler_binds_device_pods_through_the_extender(
    https: bool, cluster: Cluster, namespace: str, extender_stack: Any, key_file: Path, tmp_path: Path
) -> None:
    cluster.create_ready_node("trn1-x", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    cluster.create_ready_node("p3-x", labels=P3, allocatable={"nvidia.com/gpu": 8})
    cluster.create_ready_node(
        "intel-x", labels=INTEL, allocatable={"gpu.intel.com/i915": 8, "gpu.intel.com/memory.max": "16G"}
    )
    url, extender, scheduler = extender_stack(https)
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
    if https:
        assert "forbidden" not in extender.output().lower(), extender.output()[-3000:]
        assert not can(cluster, "patch", "pods") and can(cluster, "create", "pods", "binding")
        the_callers_own_choice(url, namespace, tmp_path)
        assert "seven" not in bound(cluster, namespace)
        assert extender.process.poll() is None


def test_kube_scheduler_binds_two_shares_to_one_gpu_and_refuses_a_third_with_kubegpus_reason(
    cluster: Cluster, namespace: str, extender_stack: Any, key_file: Path
) -> None:
    cluster.create_ready_node("hami-x", labels=HAMI_GPU, allocatable=HAMI_ALLOCATABLE)
    _, extender, scheduler = extender_stack(False)
    create_shares(cluster, namespace, "gpu-scheduler")
    try:
        placed = wait_bound(cluster, namespace, len(SHARES), timeout=60)
    except AssertionError:
        raise AssertionError(f"{extender.output()[-3000:]}\n---\n{scheduler.output()[-3000:]}") from None
    assert_shares_add_up(placed, key_file.read_text().strip().encode())

    # kube-scheduler's own sums let it through (100 of 100 gpucores); kubegpu's books of GPU 0 do not
    cluster.create_pod(namespace, "late", LATE, scheduler="gpu-scheduler")
    message = wait_for(lambda: share_refusal(cluster, namespace), 60, "late's FailedScheduling event")
    assert message == f"0/1 nodes are available: 1 {LATE_REASON}.", message
    assert "late" not in bound(cluster, namespace)


def the_callers_own_choice(url: str, namespace: str, tmp_path: Path) -> None:
    """Finding 3 of issue 10: whoever reached the port could bind any pending pod to any node. Now only a caller
    with a client certificate from the extender's CA may; the monitoring API, naming every namespace's pods, too."""
    certs, theirs = tmp_path / "certs", make_certs(tmp_path / "theirs")
    bind = orjson.dumps({"PodName": "seven", "PodNamespace": namespace, "Node": "trn1-y"})
    anonymous = tls_client(None, certs / "ca.crt")
    for method, path, body in (("POST", "/bind", bind), ("GET", "/apis/kubegpu/v1/pods", None)):
        refused = anonymous.request(method, f"{url}{path}", body=body)
        assert refused.status == 401 and b"client certificate" in refused.data, refused.data
        # A certificate from another CA fails the handshake (TLS 1.3: the client may see only the connection drop).
        with pytest.raises((urllib3.exceptions.SSLError, urllib3.exceptions.ProtocolError)):
            tls_client(theirs, certs / "ca.crt").request(method, f"{url}{path}", body=body)
    listed = tls_client(certs, certs / "ca.crt").request("GET", f"{url}/apis/kubegpu/v1/pods")
    assert listed.status == 200 and orjson.loads(listed.data)["items"]


def test_the_monitoring_api_lists_and_watches_holders(cluster: Cluster, namespace: str, extender_stack: Any) -> None:
    cluster.create_ready_node("p3-y", labels=P3, allocatable={"nvidia.com/gpu": 8})
    url, extender, _ = extender_stack(False)
    assert "--insecure-no-client-auth: callers are not authenticated" in extender.output()
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

    # A caller's invented node is refused, never learnt: no pod can be bound to it afterwards.
    invented = node_manifest("invented", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})
    one = {"limits": {"aws.amazon.com/neurondevice": "1"}}
    cluster.create_pod(namespace, "lured", {"main": {"aws.amazon.com/neurondevice": 1}}, scheduler="nobody")
    lured = {"metadata": {"name": "lured", "namespace": namespace},
             "spec": {"containers": [{"name": "main", "resources": one}]}}  # fmt: skip
    answer = http.request("POST", f"{url}/filter", body=orjson.dumps({"Pod": lured, "Nodes": {"items": [invented]}}))
    assert orjson.loads(answer.data)["FailedNodes"] == {"invented": UNKNOWN_NODE}
    bind = {"PodName": "lured", "PodNamespace": namespace, "Node": "invented"}
    refused = orjson.loads(http.request("POST", f"{url}/bind", body=orjson.dumps(bind)).data)
    assert "unknown to kubegpu" in refused["Error"], refused
    with pytest.raises(ApiError):
        cluster.client.get("/api/v1/nodes/invented")
    assert "lured" not in bound(cluster, namespace)


def test_kube_scheduler_binds_a_gang_through_the_extender_whole_in_one_rack_once_every_member_exists(
    cluster: Cluster, namespace: str, extender_stack: Any
) -> None:
    """Eight Kueue members of 4 GPUs requiring one rack: rack-b (4 nodes of 8) fits them exactly, rack-a (2) does
    not. kube-scheduler asks the extender about each member and binds it at once; none passes before the eighth
    exists, then the gang's plan (kept while the extender's own bindings follow it: gangplans.py) takes every member
    to rack-b, no device held twice."""
    from .gangs import BindRecorder, create_member, create_racks, events_of
    from .test_gangs import all_bound, assert_no_device_held_twice, racks_of

    where = create_racks(cluster, {"rack-a": 2, "rack-b": 4})
    _, extender, scheduler = extender_stack(False)
    members = [f"train-{i}" for i in range(8)]
    with BindRecorder(cluster, namespace) as recorder:
        for i, name in enumerate(members[:7]):
            create_member(cluster, namespace, name, "train", 4, total=8, scheduler="gpu-scheduler", index=i)

        def waiting() -> set[str]:
            events = events_of(cluster, namespace, "FailedScheduling")
            return {e["involvedObject"]["name"] for e in events if "of minMember 8 members exist" in e["message"]}

        try:
            wait_for(lambda: waiting() == set(members[:7]), 60, "7 members told the gang is not whole")
            assert not recorder.bound, f"bound before the gang had 8 members: {sorted(recorder.bound)}"
            create_member(cluster, namespace, members[7], "train", 4, total=8, scheduler="gpu-scheduler", index=7)
            # kube-scheduler 1.20 tries its unschedulable pods again after 60 s (a pod bound moves only those with
            # affinity terms), and flushes that queue every 30 s: up to 90 s after the eighth is bound.
            nodes = wait_for(lambda: all_bound(cluster, namespace, members), 150, "all 8 members bound")
        except AssertionError:
            raise AssertionError(f"{extender.output()[-3000:]}\n---\n{scheduler.output()[-3000:]}") from None
    assert racks_of(where, nodes) == {"rack-b"}, nodes
    assert_no_device_held_twice(cluster, namespace)


def test_kube_scheduler_1_20_2_preempts_by_its_own_sums_without_asking_the_extender(
    cluster: Cluster, namespace: str, extender_stack: Any
) -> None:
    """What the README says of preemption behind kube-scheduler 1.20.2: it never calls the extender's `preempt` verb
    (kubernetes#103019, fixed in later releases), so its victims are those its own sums choose. Two GPUs full of
    30 % shares: GPU 0 holds p1 and p2 (mid priority) and p5 (high), GPU 1 p3 (low), p4 and p6 (high).
    kube-scheduler needs 30 more `nvidia.com/gpucores` on the node and evicts p3 alone; GPU 1 is then 40 % free,
    kubegpu's `/filter` refuses the 50 % share saying so, and it waits. (kubegpu's `/preempt` would have answered
    p1 and p2, `test_extender_preempt.py`; the custom scheduler evicts those, `test_preemption.py`.)"""
    priority_classes(cluster)
    labels = {**HAMI_GPU, "nvidia.com/gpu.count": "2"}
    gpus = {"nvidia.com/gpu": 20, "nvidia.com/gpucores": 200, "nvidia.com/gpumem": 32768}
    cluster.create_ready_node("hami-pre", labels=labels, allocatable=gpus)
    extender_stack(False)
    share = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4096}
    classes = {"p1": "mid", "p2": "mid", "p3": "low", "p4": "high", "p5": "high", "p6": "high"}
    for name, level in classes.items():  # one at a time: each placement follows the last
        create(cluster, namespace, name, 0, "gpu-scheduler", f"kubegpu-test-{level}", limits=share)
        wait_for(lambda n=name: n in bound(cluster, namespace), 60, f"{name} bound")
    held = {name: devices(cluster, namespace, name, "nvidia.com/gpu") for name in classes}
    assert held == {"p1": ["0"], "p2": ["0"], "p3": ["1"], "p4": ["1"], "p5": ["0"], "p6": ["1"]}, held

    create(
        cluster, namespace, "infer", 0, "gpu-scheduler", "kubegpu-test-top", limits={**share, "nvidia.com/gpucores": 50}
    )
    reason = "GPU 1 has 40% compute free, the pod asks 50%"

    def refused() -> bool:
        conditions = pods_in(cluster, namespace)["infer"].get("status", {}).get("conditions") or []
        return any(reason in c.get("message", "") for c in conditions)

    wait_for(refused, 60, "infer's PodScheduled condition with kubegpu's reason")
    assert set(pods_in(cluster, namespace)) == {"p1", "p2", "p4", "p5", "p6", "infer"}
    assert "infer" not in bound(cluster, namespace)


def test_the_rest_of_a_gang_kube_scheduler_preempts_one_worker_of_goes_too(
    cluster: Cluster, namespace: str, extender_stack: Any
) -> None:
    """A running Kueue gang of two 8-GPU workers (low priority) fills a rack of two nodes; a pod of the top priority
    asks 8 GPUs. kube-scheduler 1.20.2 evicts one worker by its own sums (it never asks `/preempt`) and nominates the
    pod there; the extender, under the shipped RBAC, evicts the other worker, which would otherwise run alone below
    minMember holding its 8 GPUs, tells it why, and marks it `DisruptionTarget` first, as kube-scheduler 1.26+
    marks its own victims (the workers carry a finalizer, so that they stay, deleted, long enough to be read)."""
    from .gangs import create_member, create_racks, events_of

    priority_classes(cluster)
    create_racks(cluster, {"rack-a": 2})
    # 1.20.2 is older than the 1.26 `--disruption-conditions auto` marks from: the operator's `on` is tried here.
    url, extender, scheduler = extender_stack(True, "--disruption-conditions=on")
    # Its role lists PodDisruptionBudgets (`/preempt` counts those the rest of a victim's gang violates).
    ready = orjson.loads(urllib3.PoolManager(cert_reqs="CERT_NONE").request("GET", f"{url}/readyz").data)
    assert ready["apis"]["poddisruptionbudgets"] == "policy/v1beta1", ready
    workers = ["w-0", "w-1"]
    for i, name in enumerate(workers):
        create_member(
            cluster, namespace, name, "train", 8, total=2, scheduler="gpu-scheduler", index=i,
            priority="kubegpu-test-low",
        )  # fmt: skip
    try:
        wait_for(lambda: set(workers) <= set(bound(cluster, namespace)), 120, "both workers bound")
        hold, TARGET = {"metadata": {"finalizers": ["kubegpu.test/hold"]}}, "DisruptionTarget"
        for name in workers:
            cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", hold)
        create(cluster, namespace, "vip", 0, "gpu-scheduler", "kubegpu-test-top", limits={"nvidia.com/gpu": 8})

        def deleted() -> dict[str, dict[str, Any]]:
            found = {p["metadata"]["name"]: p for p in cluster.pods(namespace) if p["metadata"]["name"] in workers}
            leaving = [p for p in found.values() if p["metadata"].get("deletionTimestamp")]
            return found if len(leaving) == 2 else {}

        leaving = wait_for(deleted, 90, "both workers deleted")
        marks = {
            name: [(c["status"], c["reason"]) for c in p["status"].get("conditions", []) if c["type"] == TARGET]
            for name, p in leaving.items()
        }
        # kube-scheduler 1.20.2 marks nothing; the worker the extender evicted is marked.
        assert sorted(marks.values()) == [[], [("True", "PreemptionByScheduler")]], marks
        for name in workers:
            cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"finalizers": None}})
        wait_for(lambda: not set(workers) & set(pods_in(cluster, namespace)), 90, "both workers evicted")
    except AssertionError:
        raise AssertionError(f"{extender.output()[-3000:]}\n---\n{scheduler.output()[-3000:]}") from None
    notes = [e.get("note") or e.get("message") or "" for e in events_of(cluster, namespace, "Preempted")]
    assert any("Preempted by" in n and "vip" in n and "minMember 2" in n for n in notes), notes


class GangCut:
    """A running gang (PodGroup `train`, minMember 3) of 8-GPU workers w-0..w-2 on nodes cut-0..cut-2, written to the
    real API server with a finalizer (so that a deleted member stays, deleted), and extenders in this process
    following it, each with its own writer: `cut()` is kube-scheduler preempting w-0 for `vip` (priority 1000),
    nominated on cut-0, as each extender's informer reports it."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        from kubegpu.core.testing import pod_manifest

        self.cluster, self.namespace = cluster, namespace
        self.group = {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": namespace, "uid": "pg-train", "resourceVersion": "1"},
            "spec": {"minMember": 3},
        }
        self.nodes = [f"cut-{i}" for i in range(3)]
        self.workers = []
        for i, node in enumerate(self.nodes):
            pod = pod_manifest(f"w-{i}", {"main": {"nvidia.com/gpu": 8}}, namespace=namespace)
            pod["metadata"].update(labels={"scheduling.x-k8s.io/pod-group": "train"}, finalizers=["kubegpu.test/hold"])
            pod["spec"].update(nodeName=node, priority=0)
            self.workers.append(cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", pod))
        self.writers: list[Any] = []
        self.futures: list[Any] = []
        self.servers: list[Any] = []

    def extender(self, writer: Any, marks: bool) -> Any:
        from kubegpu.core.plugin_manager import make_plugin_manager
        from kubegpu.plugins.nvidia import scheduler as nvidia
        from kubegpu.scheduler.engine import Engine
        from kubegpu.scheduler.extender import ExtenderServer

        self.writers.append(writer)
        plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
        engine = Engine(plugins, signing_key=b"k" * 32)
        server = ExtenderServer(engine, self.cluster.client, writer, disruption_conditions="on" if marks else "off")
        server.binder.submit = lambda c, w=writer: self.futures.append(w.submit(c))  # type: ignore[method-assign]
        # A member another extender marked is looked at again once the mark is no longer trusted (a minute): here
        # 2 s, so that every extender's work has ended, and what it wrote can be counted, within the test.
        server.binder.mark_trusted_seconds = 2.0
        labels = {"node.kubernetes.io/instance-type": "p5.48xlarge", "nvidia.com/gpu.count": "8"}
        server.mirror.on_nodes("SYNC", [node_manifest(n, labels=labels, allocatable={"nvidia.com/gpu": 8})
                                        for n in self.nodes])  # fmt: skip
        server.mirror.on_podgroups("SYNC", [self.group])
        server.mirror.on_pods("SYNC", self.workers)
        self.servers.append(server)
        return server

    def cut(self) -> None:
        from kubegpu.core.testing import pod_manifest

        self.cluster.client.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/w-0")  # kube-scheduler's
        leaving = pods_in(self.cluster, self.namespace)["w-0"]
        vip = pod_manifest("vip", {"main": {"nvidia.com/gpu": 8}}, namespace=self.namespace)
        vip["metadata"].update(uid="uid-vip", resourceVersion="1")
        vip["spec"]["priority"] = 1000
        vip["status"] = {"nominatedNodeName": "cut-0"}
        for server in self.servers:  # every informer reports the same two changes
            server.mirror.on_pods("MODIFIED", leaving)
            server.mirror.on_pods("ADDED", vip)

    def told(self) -> list[str]:
        """The pods told `Preempted`, once per Event."""
        from .gangs import events_of

        return sorted(e["involvedObject"]["name"] for e in events_of(self.cluster, self.namespace, "Preempted"))

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for name in ("w-0", "w-1", "w-2"):
            path = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
            with contextlib.suppress(ApiError):
                self.cluster.client.patch(path, {"metadata": {"finalizers": None}})


@pytest.mark.parametrize("marks", [False, True], ids=["unmarked-1.20", "marked-1.26"])
def test_two_extenders_following_one_gang_cut_evict_each_member_once(
    cluster: Cluster, namespace: str, marks: bool
) -> None:
    """The extender-ha overlay runs two extenders, and both see kube-scheduler preempt worker w-0 of a running gang
    (minMember 3) and nominate `vip` there: each decides that w-1 and w-2 must go too. Before, both deleted them
    and each member got two `Preempted` Events; now, writing to the real API server at once, one extender wins each
    member (its first write is guarded by the `resourceVersion` it read: the mark where marks are written, else the
    deletion) and only it tells the member why. The members carry a finalizer, so that they stay, deleted."""
    gang = GangCut(cluster, namespace)
    try:
        for _ in range(2):
            gang.extender(AsyncKubeClient(cluster.client.credentials, cluster.client.limiter, connections=2), marks)
        gang.cut()
        assert len(gang.futures) == 2, "each extender follows the cut"
        for future in gang.futures:
            future.result(timeout=30)
        found = pods_in(cluster, namespace)
        assert all(found[f"w-{i}"]["metadata"].get("deletionTimestamp") for i in (1, 2)), "the rest evicted"
        assert gang.told() == ["w-1", "w-2"]
        targets = [c for i in (1, 2) for c in found[f"w-{i}"]["status"].get("conditions", [])
                   if c["type"] == "DisruptionTarget"]  # fmt: skip
        assert len(targets) == (2 if marks else 0), targets
    finally:
        gang.close()


class RefusingWriter(AsyncKubeClient):
    """An API writer whose first deletion of each pod fails as a transient fault would (a 500: an admission webhook
    that timed out, an etcd leader change)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.client.credentials, cluster.client.limiter, connections=2)
        self.refused: list[str] = []

    async def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if method == "DELETE" and "/pods/" in path and path not in self.refused:
            self.refused.append(path)
            raise ApiError(500, "InternalError", "injected: etcdserver: leader changed")
        return await super().request(method, path, *args, **kwargs)


@pytest.mark.parametrize("marks", [False, True], ids=["unmarked-1.20", "marked-1.26"])
def test_a_gang_members_eviction_whose_deletion_failed_once_is_retried_and_told_once(
    cluster: Cluster, namespace: str, marks: bool
) -> None:
    """Both extenders follow the cut, and the first deletion each sends fails (a 500). The extender that won a member
    (its guarded mark, or its deletion) retries its deletion: w-1 and w-2 go, each told `Preempted` once (before:
    the winner's mark stayed, without a deletion, and the other extender left a marked member alone: both ran on
    below minMember)."""
    gang = GangCut(cluster, namespace)
    try:
        for _ in range(2):
            gang.extender(RefusingWriter(cluster), marks)
        gang.cut()
        for future in gang.futures:
            future.result(timeout=30)
        found = pods_in(cluster, namespace)
        assert all(found[f"w-{i}"]["metadata"].get("deletionTimestamp") for i in (1, 2)), "the rest evicted"
        assert gang.told() == ["w-1", "w-2"]
        assert sum(len(w.refused) for w in gang.writers) >= 2  # the faults were met
    finally:
        gang.close()


def test_a_gang_member_another_hand_marked_and_never_deleted_is_evicted_once_the_mark_is_not_trusted(
    cluster: Cluster, namespace: str
) -> None:
    """Another hand (an extender whose process stopped, a kube-scheduler whose deletion failed) marked w-1 and w-2
    `DisruptionTarget` and never deleted them. The extender following the cut waits while such a mark may still be
    followed by its deletion, then evicts them itself, telling each why once (before: "already being evicted", and
    nothing evicted them ever)."""
    gang = GangCut(cluster, namespace)
    try:
        for i in (1, 2):
            condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                         "message": "kubegpu extender: evicting the rest of gang train",
                         "lastTransitionTime": now_rfc3339()}  # fmt: skip
            cluster.client.patch(
                f"/api/v1/namespaces/{namespace}/pods/w-{i}/status", {"status": {"conditions": [condition]}},
                strategic=True,
            )  # fmt: skip
        gang.extender(AsyncKubeClient(cluster.client.credentials, cluster.client.limiter, connections=2), True)
        gang.cut()
        (future,) = gang.futures
        future.result(timeout=30)
        found = pods_in(cluster, namespace)
        assert all(found[f"w-{i}"]["metadata"].get("deletionTimestamp") for i in (1, 2)), "the rest evicted"
        assert gang.told() == ["w-1", "w-2"]
    finally:
        gang.close()
