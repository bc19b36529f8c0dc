"""Preemption by `kubegpu scheduler` on a real kube-apiserver: an important pod finds the cluster full of devices.

The victims run with `terminationGracePeriodSeconds: 0`, so the API server removes them at once (no kubelet runs
here to confirm a graceful shutdown); the scheduler's own steps (nominatedNodeName, Preempted events, deletions,
the bind once they are gone) are what is checked.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation
from kubegpu.core.models import PodRequest
from kubegpu.kube.client import ApiError, AsyncKubeClient
from kubegpu.scheduler.binder import Binder
from kubegpu.scheduler.health import Metrics

from .cluster import Cluster, running_cluster, wait_for

TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
DEVICE = "aws.amazon.com/neurondevice"
CLASSES = {"kubegpu-test-low": 10, "kubegpu-test-mid": 100, "kubegpu-test-high": 500, "kubegpu-test-top": 1000}


def priority_classes(cluster: Cluster) -> None:
    for name, value in CLASSES.items():
        try:
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
            cluster.client.post("/apis/scheduling.k8s.io/v1/priorityclasses", {**body, "value": value})
        except ApiError as exc:
            if exc.status != 409:  # created by an earlier test of this session
                raise


def create(
    cluster: Cluster,
    namespace: str,
    name: str,
    devices: int,
    scheduler: str,
    priority: str | None = None,
    spec: dict[str, Any] | None = None,
    limits: dict[str, int] | None = None,
    **meta: Any,
) -> None:
    asked = {r: str(v) for r, v in (limits or {DEVICE: devices}).items()}
    spec = {
        **(spec or {}),
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": asked}}],
    }
    if priority:
        spec["priorityClassName"] = priority
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, **meta}, "spec": spec}
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)


def pods(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.pods(namespace)}


def bound_to(cluster: Cluster, namespace: str, name: str) -> str | None:
    pod = pods(cluster, namespace).get(name)
    return (pod or {}).get("spec", {}).get("nodeName")


def devices(cluster: Cluster, namespace: str, name: str, resource: str = DEVICE) -> list[str]:
    pod = pods(cluster, namespace)[name]
    record = decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY])
    return record.containers["main"][resource]


def wait_bound(cluster: Cluster, namespace: str, *names: str, timeout: float = 30.0) -> None:
    wait_for(lambda: all(bound_to(cluster, namespace, n) for n in names), timeout, f"{names} bound")


def readiness(scheduler: Any) -> tuple[int, dict[str, Any]]:
    """The scheduler's `/readyz`: its status and its JSON body."""
    answer = urllib3.request("GET", f"http://127.0.0.1:{scheduler.metrics_port}/readyz", timeout=2.0)
    return answer.status, orjson.loads(answer.data)


def ready(scheduler: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def answered() -> bool:
        try:
            status, found["body"] = readiness(scheduler)
        except (urllib3.exceptions.HTTPError, orjson.JSONDecodeError):
            return False
        return status == 200

    wait_for(answered, 30, "the scheduler's /readyz 200")
    return found["body"]


def test_a_priority_1000_pod_evicts_the_low_priority_pods_filling_a_trn1_and_binds_all_16_devices(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    priority_classes(cluster)
    cluster.create_ready_node("trn1-p", labels=TRN1, allocatable={DEVICE: 16})
    start_scheduler("kubegpu-preempt", "--no-leader-elect")
    for i in range(4):
        create(cluster, namespace, f"filler-{i}", 4, "kubegpu-preempt")
    wait_bound(cluster, namespace, *(f"filler-{i}" for i in range(4)))

    create(cluster, namespace, "trainer", 16, "kubegpu-preempt", "kubegpu-test-top")
    wait_bound(cluster, namespace, "trainer")

    left = pods(cluster, namespace)
    assert set(left) == {"trainer"}, "every filler was evicted"
    assert devices(cluster, namespace, "trainer") == [str(i) for i in range(16)]
    reasons = [(e["reason"], e["involvedObject"]["name"]) for e in cluster.events(namespace)]
    assert {name for reason, name in reasons if reason == "Preempted"} == {f"filler-{i}" for i in range(4)}


def test_an_eight_device_pod_evicts_only_the_lower_priority_of_two_holders(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    priority_classes(cluster)
    cluster.create_ready_node("trn1-q", labels=TRN1, allocatable={DEVICE: 16})
    start_scheduler("kubegpu-preempt-2", "--no-leader-elect")
    create(cluster, namespace, "important", 8, "kubegpu-preempt-2", "kubegpu-test-high")
    create(cluster, namespace, "batch", 8, "kubegpu-preempt-2", "kubegpu-test-low")
    wait_bound(cluster, namespace, "important", "batch")
    freed = devices(cluster, namespace, "batch")

    create(cluster, namespace, "urgent", 8, "kubegpu-preempt-2", "kubegpu-test-mid")
    wait_bound(cluster, namespace, "urgent")

    assert set(pods(cluster, namespace)) == {"important", "urgent"}
    assert devices(cluster, namespace, "urgent") == freed


@pytest.mark.parametrize("listed", ["share-resources", "gpu-only"])
def test_a_half_gpu_share_evicts_two_low_shares_of_the_gpu_it_gets_and_nothing_else(
    cluster: Cluster, namespace: str, start_scheduler: Any, listed: str
) -> None:
    """Two 16 GiB GPUs shared HAMi-style, full of 30 % shares: three of low priority, three of mid. A 50 % share of
    top priority evicts the two low shares of one GPU (the third low share, on the other GPU, is reprieved; no mid
    share goes) and binds to the GPU they freed, within its 100 %. Also where the node lists `nvidia.com/gpu` alone,
    as HAMi's device plugin leaves it (before, no share preempted there)."""
    priority_classes(cluster)
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384", "kubegpu-test/listed": listed}
    gpus = {"nvidia.com/gpu": 20, "nvidia.com/gpucores": 200, "nvidia.com/gpumem-percentage": 200}
    if listed == "gpu-only":
        gpus = {"nvidia.com/gpu": 20}
    cluster.create_ready_node(f"hami-{listed}", labels=labels, allocatable=gpus)
    scheduler = f"kubegpu-preempt-{listed}"
    start_scheduler(scheduler, "--no-leader-elect")

    here = {"nodeSelector": {"kubegpu-test/listed": listed}}  # not the other parameter's node, if still there

    def share(percent: int) -> dict[str, int]:
        return {"nvidia.com/gpu": 1, "nvidia.com/gpucores": percent, "nvidia.com/gpumem-percentage": percent}

    for i in range(3):
        create(cluster, namespace, f"batch-{i}", 0, scheduler, "kubegpu-test-low", here, limits=share(30))
        wait_bound(cluster, namespace, f"batch-{i}")
    for i in range(3):
        create(cluster, namespace, f"mid-{i}", 0, scheduler, "kubegpu-test-mid", here, limits=share(30))
    wait_bound(cluster, namespace, *(f"mid-{i}" for i in range(3)))
    gpu = {name: devices(cluster, namespace, name, "nvidia.com/gpu") for name in pods(cluster, namespace)}

    create(cluster, namespace, "infer", 0, scheduler, "kubegpu-test-top", here, limits=share(50))
    wait_bound(cluster, namespace, "infer")

    left = set(pods(cluster, namespace))
    evicted = set(gpu) - left
    assert len(evicted) == 2 and all(name.startswith("batch-") for name in evicted), left
    taken = devices(cluster, namespace, "infer", "nvidia.com/gpu")
    assert all(gpu[name] == taken for name in evicted), (gpu, taken)
    assert sum(30 for name in left - {"infer"} if gpu[name] == taken) + 50 <= 100
    reasons = [(e["reason"], e["involvedObject"]["name"]) for e in cluster.events(namespace)]
    assert {name for reason, name in reasons if reason == "Preempted"} == evicted


def test_a_disruption_budget_and_equal_priority_are_respected(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    priority_classes(cluster)
    for name in ("trn1-r", "trn1-s"):
        cluster.create_ready_node(name, labels=TRN1, allocatable={DEVICE: 16})
    budget = {
        "apiVersion": "policy/v1beta1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }
    cluster.client.post(f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets", budget)
    scheduler = start_scheduler("kubegpu-preempt-3", "--no-leader-elect")
    # 1.20 serves budgets only as policy/v1beta1: discovery finds it (policy/v1 would be chosen where served, 1.21+).
    assert ready(scheduler)["apis"]["poddisruptionbudgets"] == "policy/v1beta1"
    create(cluster, namespace, "db", 16, "kubegpu-preempt-3", labels={"app": "db"})
    create(cluster, namespace, "batch", 16, "kubegpu-preempt-3", labels={"app": "batch"})
    wait_bound(cluster, namespace, "db", "batch")
    db_node = bound_to(cluster, namespace, "db")

    create(cluster, namespace, "urgent", 16, "kubegpu-preempt-3", "kubegpu-test-top")
    wait_bound(cluster, namespace, "urgent")
    assert set(pods(cluster, namespace)) == {"db", "urgent"}, "the budget kept db; batch was evicted instead"
    assert bound_to(cluster, namespace, "db") == db_node

    # A peer of equal priority asking for urgent's node preempts nobody: urgent keeps running, the peer waits.
    urgent_node = bound_to(cluster, namespace, "urgent")
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [urgent_node]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    create(cluster, namespace, "peer", 16, "kubegpu-preempt-3", "kubegpu-test-top", spec={"affinity": affinity})
    wait_for(
        lambda: any(
            e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "peer"
            for e in cluster.events(namespace)
        ),
        30,
        "the peer reported unschedulable",
    )
    left = pods(cluster, namespace)
    assert bound_to(cluster, namespace, "urgent") and not left["peer"]["spec"].get("nodeName")


def test_an_api_server_serving_no_budget_api_is_named_and_preemption_goes_on_without_budgets(
    start_scheduler: Any, tmp_path: Path
) -> None:
    """A kube-apiserver 1.20.2 with policy/v1beta1 turned off serves no PodDisruptionBudget version at all (as a
    1.25+ server would serve no v1beta1): the scheduler says so once, becomes ready, and still preempts."""
    with running_cluster(tmp_path / "k8s", "--runtime-config=policy/v1beta1=false") as bare:
        namespace = bare.create_namespace("no-budgets")
        priority_classes(bare)
        bare.create_ready_node("trn1-t", labels=TRN1, allocatable={DEVICE: 16})
        scheduler = start_scheduler("kubegpu-preempt-4", "--no-leader-elect", kubeconfig=bare.kubeconfig)
        body = ready(scheduler)
        assert body["apis"]["poddisruptionbudgets"] is None
        # (PodGroups and DRA are missing too: the test server has neither's CRDs.)
        assert "the API server serves no version of poddisruptionbudgets that kubegpu reads" in body["missing"]
        scheduler.wait_logged("serves PodDisruptionBudgets in none of policy/v1, policy/v1beta1")

        create(bare, namespace, "batch", 16, "kubegpu-preempt-4", labels={"app": "batch"})
        wait_bound(bare, namespace, "batch")
        create(bare, namespace, "urgent", 16, "kubegpu-preempt-4", "kubegpu-test-top")
        wait_bound(bare, namespace, "urgent")
        assert set(pods(bare, namespace)) == {"urgent"}
        assert scheduler.output().count("serves PodDisruptionBudgets in none") == 1, "said once, not in a loop"


def test_a_victim_is_marked_disruption_target_before_it_is_deleted_as_kube_scheduler_1_26_does(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    """A Job whose `podFailurePolicy` ignores `DisruptionTarget` failures must see the condition on a pod kubegpu
    preempts, as on one kube-scheduler 1.26+ preempts. The victim carries a finalizer, so it stays, deleted but
    present, long enough to be read."""
    priority_classes(cluster)
    cluster.create_ready_node("trn1-u", labels=TRN1, allocatable={DEVICE: 16})
    # 1.20.2 is older than the 1.26 `--disruption-conditions auto` marks from: the operator's `on` is tried here.
    start_scheduler("kubegpu-preempt-5", "--no-leader-elect", "--disruption-conditions=on")
    create(cluster, namespace, "batch", 16, "kubegpu-preempt-5", finalizers=["kubegpu.test/hold"])
    wait_bound(cluster, namespace, "batch")
    create(cluster, namespace, "urgent", 16, "kubegpu-preempt-5", "kubegpu-test-top")
    wait_for(lambda: pods(cluster, namespace)["batch"]["metadata"].get("deletionTimestamp"), 30, "batch deleted")

    batch = pods(cluster, namespace)["batch"]
    marks = [c for c in batch["status"].get("conditions", []) if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c["reason"], c["message"]) for c in marks] == [
        ("True", "PreemptionByScheduler", "kubegpu-preempt-5: preempting to accommodate a higher priority pod")
    ]
    assert not bound_to(cluster, namespace, "urgent"), "the preemptor waits until its victim is gone"
    cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/batch", {"metadata": {"finalizers": None}})
    wait_bound(cluster, namespace, "urgent")


def test_pods_of_lower_priority_land_beside_a_preemptor_waiting_for_its_victims_grace_period(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    """A trn1 torus whose rows 0..2 each hold one device of a pod of priority 500 and row 3 one of `victim`
    (priority 10, `terminationGracePeriodSeconds: 600`, as a job that checkpoints). A 4-device `trainer` of
    priority 1000 preempts `victim`, which stays Terminating (no kubelet runs here to end it), and is nominated
    there. Before, the node refused every pod of its priority or lower until the trainer bound; now three 1-device
    pods land in rows 0..2, beside it, leaving it row 3. Once the victim is gone the trainer binds to row 3. No
    device is held by two pods at any point."""
    priority_classes(cluster)
    cluster.create_ready_node("trn1-hold", labels={**TRN1, "kubegpu-test/hold": "yes"}, allocatable={DEVICE: 16})
    scheduler = "kubegpu-preempt-hold"
    start_scheduler(scheduler, "--no-leader-elect")
    here = {"nodeSelector": {"kubegpu-test/hold": "yes"}}  # not another test's node, if still there

    def disjoint() -> dict[str, list[str]]:
        bound = [name for name, p in pods(cluster, namespace).items() if p["spec"].get("nodeName")]
        held = {name: devices(cluster, namespace, name) for name in bound}
        ids = [i for taken in held.values() for i in taken]
        assert len(ids) == len(set(ids)), held
        return held

    fillers: list[str] = []
    for row, keeper in enumerate(("x", "y", "z")):
        create(cluster, namespace, keeper, 1, scheduler, "kubegpu-test-high", here)
        wait_bound(cluster, namespace, keeper)
        names = [f"f{row}-{i}" for i in range(3)]
        for name in names:
            create(cluster, namespace, name, 1, scheduler, "kubegpu-test-low", here)
        wait_bound(cluster, namespace, *names)
        fillers += names
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "victim", "namespace": namespace},
        "spec": {
            **here,
            "schedulerName": scheduler,
            "priorityClassName": "kubegpu-test-low",
            "terminationGracePeriodSeconds": 600,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {DEVICE: "1"}}}],
        },
    }
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)
    wait_bound(cluster, namespace, "victim")
    assert devices(cluster, namespace, "victim") == ["12"]
    for name in fillers:
        cluster.delete_pod(namespace, name)
    wait_for(lambda: not set(fillers) & set(pods(cluster, namespace)), 30, "the fillers gone")

    create(cluster, namespace, "trainer", 4, scheduler, "kubegpu-test-top", here)
    wait_for(
        lambda: (pods(cluster, namespace)["trainer"].get("status") or {}).get("nominatedNodeName") == "trn1-hold",
        30,
        "the trainer nominated",
    )
    assert pods(cluster, namespace)["victim"]["metadata"].get("deletionTimestamp"), "the victim is terminating"
    late = [f"late-{i}" for i in range(3)]
    for name in late:
        create(cluster, namespace, name, 1, scheduler, "kubegpu-test-mid", here)
    wait_bound(cluster, namespace, *late)
    held = disjoint()
    assert all(int(held[name][0]) < 12 for name in late), held
    assert not bound_to(cluster, namespace, "trainer") and "victim" in held

    cluster.delete_pod(namespace, "victim")  # its grace period over
    wait_bound(cluster, namespace, "trainer")
    held = disjoint()
    assert held["trainer"] == ["12", "13", "14", "15"], held


def test_a_higher_priority_pod_preempts_on_the_node_held_for_a_lower_one_which_loses_its_nomination(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    """One trn1: `keep` (priority 500) and `batch` (10, held Terminating by a finalizer) hold 8 devices each. `mid`
    (100) preempts `batch` and is nominated there, waiting for it. `top` (1000) needs all 16: the node held for
    `mid` is its only place, and kube-scheduler preempts there, counting only nominees of its own priority or
    higher. `top` evicts `keep` and is nominated, and `mid` loses its nomination (its `status.nominatedNodeName`
    cleared, as kube-scheduler clears it), instead of waiting on for a node whose room is now `top`'s. Once
    `batch` is gone, `top` binds all 16 devices; `mid` stays pending, nominated nowhere."""
    priority_classes(cluster)
    cluster.create_ready_node("trn1-lose", labels={**TRN1, "kubegpu-test/lose": "yes"}, allocatable={DEVICE: 16})
    scheduler = "kubegpu-preempt-lose"
    start_scheduler(scheduler, "--no-leader-elect")
    here = {"nodeSelector": {"kubegpu-test/lose": "yes"}}
    create(cluster, namespace, "keep", 8, scheduler, "kubegpu-test-high", here)
    create(cluster, namespace, "batch", 8, scheduler, "kubegpu-test-low", here, finalizers=["kubegpu.test/hold"])
    wait_bound(cluster, namespace, "keep", "batch")

    def nominated(name: str) -> str | None:
        return (pods(cluster, namespace)[name].get("status") or {}).get("nominatedNodeName")

    create(cluster, namespace, "mid", 8, scheduler, "kubegpu-test-mid", here)
    wait_for(lambda: nominated("mid") == "trn1-lose", 30, "mid nominated")
    assert pods(cluster, namespace)["batch"]["metadata"].get("deletionTimestamp"), "batch is terminating"

    create(cluster, namespace, "top", 16, scheduler, "kubegpu-test-top", here)
    wait_for(lambda: nominated("top") == "trn1-lose", 30, "top nominated")
    wait_for(lambda: "keep" not in pods(cluster, namespace), 30, "keep evicted")
    wait_for(lambda: not nominated("mid"), 30, "mid's nomination cleared")

    cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/batch", {"metadata": {"finalizers": None}})
    wait_bound(cluster, namespace, "top")
    assert devices(cluster, namespace, "top") == [str(i) for i in range(16)]
    assert not bound_to(cluster, namespace, "mid") and not nominated("mid")


def test_a_victim_already_terminating_is_not_deleted_or_told_again_by_a_second_preemptor(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    """`batch` (priority 10, held Terminating by a finalizer, as a pod in its grace period) holds a whole trn1.
    `mid` (100) preempts it and is nominated there. `top` (1000) needs the node too: it preempts there, counting
    `batch` as its victim, and `mid` loses its nomination. Before, `top` deleted `batch` a second time and gave it a
    second `Preempted` Event (kube-scheduler 1.31+ skips a victim whose deletion has started); now `batch` keeps
    the one Event, naming `mid`, and `top` binds once it is gone."""
    priority_classes(cluster)
    cluster.create_ready_node("trn1-again", labels={**TRN1, "kubegpu-test/again": "yes"}, allocatable={DEVICE: 16})
    scheduler = "kubegpu-preempt-again"
    start_scheduler(scheduler, "--no-leader-elect")
    here = {"nodeSelector": {"kubegpu-test/again": "yes"}}
    create(cluster, namespace, "batch", 16, scheduler, "kubegpu-test-low", here, finalizers=["kubegpu.test/hold"])
    wait_bound(cluster, namespace, "batch")

    def nominated(name: str) -> str | None:
        return (pods(cluster, namespace)[name].get("status") or {}).get("nominatedNodeName")

    def preempted() -> list[str]:
        events = cluster.events(namespace)
        return [e["message"] for e in events if e["reason"] == "Preempted" and e["involvedObject"]["name"] == "batch"]

    create(cluster, namespace, "mid", 16, scheduler, "kubegpu-test-mid", here)
    wait_for(lambda: nominated("mid") == "trn1-again", 30, "mid nominated")
    wait_for(lambda: len(preempted()) == 1, 30, "batch's Preempted Event")
    create(cluster, namespace, "top", 16, scheduler, "kubegpu-test-top", here)
    wait_for(lambda: nominated("top") == "trn1-again", 30, "top nominated")
    wait_for(lambda: not nominated("mid"), 30, "mid's nomination cleared")
    cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/batch", {"metadata": {"finalizers": None}})
    wait_bound(cluster, namespace, "top")
    told = preempted()
    assert len(told) == 1 and f"{namespace}/mid" in told[0], told
    assert not bound_to(cluster, namespace, "mid")


def test_a_nominee_whose_room_a_pod_of_higher_priority_took_loses_its_nomination(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    """`mid` (priority 100) preempts `batch` (10, held Terminating by a finalizer) on the only trn1 and is nominated
    there. Before `batch` goes, another scheduler binds `vip` (1000) to the node. Once `batch` is gone `mid` fits
    nowhere and finds no victims: its `status.nominatedNodeName` is cleared (it said, for as long as `mid` waited,
    that it would run on a node held for it no more)."""
    priority_classes(cluster)
    cluster.create_ready_node("trn1-took", labels={**TRN1, "kubegpu-test/took": "yes"}, allocatable={DEVICE: 16})
    scheduler = "kubegpu-preempt-took"
    start_scheduler(scheduler, "--no-leader-elect")
    here = {"nodeSelector": {"kubegpu-test/took": "yes"}}
    create(cluster, namespace, "batch", 16, scheduler, "kubegpu-test-low", here, finalizers=["kubegpu.test/hold"])
    wait_bound(cluster, namespace, "batch")

    def nominated(name: str) -> str | None:
        return (pods(cluster, namespace)[name].get("status") or {}).get("nominatedNodeName")

    create(cluster, namespace, "mid", 16, scheduler, "kubegpu-test-mid", here)
    wait_for(lambda: nominated("mid") == "trn1-took", 30, "mid nominated")
    create(cluster, namespace, "vip", 16, "another-scheduler", "kubegpu-test-top", {"nodeName": "trn1-took"})
    cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/batch", {"metadata": {"finalizers": None}})
    wait_for(lambda: "batch" not in pods(cluster, namespace), 30, "batch gone")
    wait_for(lambda: not nominated("mid"), 30, "mid's nomination cleared")
    assert not bound_to(cluster, namespace, "mid")


def test_an_unschedulable_condition_for_a_pod_deleted_and_made_again_leaves_the_new_pods_status(
    cluster: Cluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`PodScheduled=False` written for a pod that was deleted and made again under its name before the write's turn
    came (a controller's new pod, which may already be bound) lands on neither: it names the old pod's UID. Written
    for the pod itself, it lands; for a pod gone, nothing is warned of."""
    path = f"/api/v1/namespaces/{namespace}/pods/job"
    old = cluster.create_pod(namespace, "job", {"main": {}}, scheduler="kubegpu-nobody")
    cluster.client.request("DELETE", path, body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    wait_for(lambda: "job" not in pods(cluster, namespace), 30, "the old job gone")
    new = cluster.create_pod(namespace, "job", {"main": {}}, scheduler="kubegpu-nobody")

    def scheduled() -> list[dict[str, Any]]:
        conditions = pods(cluster, namespace)["job"]["status"].get("conditions") or []
        return [c for c in conditions if c.get("type") == "PodScheduled"]

    writer = AsyncKubeClient(cluster.client.credentials, cluster.client.limiter, connections=2)
    try:
        binder = Binder(writer, Metrics(), component="kubegpu-test")
        stale = PodRequest(namespace, "job", old["metadata"]["uid"], ())
        writer.submit(binder.report_unschedulable(stale, "0/1 nodes are available: stale.")).result(timeout=30)
        assert scheduled() == [], "the new pod keeps its own status"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a pod gone is nothing to warn of"
        fresh = PodRequest(namespace, "job", new["metadata"]["uid"], ())
        writer.submit(binder.report_unschedulable(fresh, "0/1 nodes are available: fresh.")).result(timeout=30)
        assert [(c["status"], c["message"]) for c in scheduled()] == [("False", "0/1 nodes are available: fresh.")]
    finally:
        writer.close()


def test_a_nomination_cleared_for_a_pod_that_was_deleted_and_made_again_leaves_the_new_pods_nomination(
    cluster: Cluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A preemption displaces nominee `mid` and clears its `status.nominatedNodeName`, the write waiting its turn behind
    others. Meanwhile `mid` was deleted and made again under its name (a controller's new pod), and nominated anew. The
    clear is the old pod's: the new pod keeps its nomination, as a deletion guarded by the victim's UID never deletes a
    newcomer of the same name. Setting a nomination is guarded the same way."""
    path = f"/api/v1/namespaces/{namespace}/pods/mid"
    old = cluster.create_pod(namespace, "mid", {"main": {}}, scheduler="kubegpu-nobody")
    cluster.client.request("DELETE", path, body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    wait_for(lambda: "mid" not in pods(cluster, namespace), 30, "the old mid gone")
    new = cluster.create_pod(namespace, "mid", {"main": {}}, scheduler="kubegpu-nobody")
    cluster.client.patch(f"{path}/status", {"status": {"nominatedNodeName": "trn1-new"}})
    stale = PodRequest(namespace, "mid", old["metadata"]["uid"], ())
    writer = AsyncKubeClient(cluster.client.credentials, cluster.client.limiter, connections=2)
    try:
        binder = Binder(writer, Metrics(), component="kubegpu-test")
        writer.submit(binder.clear_nomination(stale)).result(timeout=30)
        assert pods(cluster, namespace)["mid"]["status"].get("nominatedNodeName") == "trn1-new"
        writer.submit(binder.nominate(stale, "trn1-old")).result(timeout=30)
        assert pods(cluster, namespace)["mid"]["status"].get("nominatedNodeName") == "trn1-new"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a pod gone is nothing to warn of"
        fresh = PodRequest(namespace, "mid", new["metadata"]["uid"], ())
        writer.submit(binder.clear_nomination(fresh)).result(timeout=30)
        assert not pods(cluster, namespace)["mid"]["status"].get("nominatedNodeName"), "its own pod's is cleared"
        cluster.client.request(
            "DELETE", path, body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        )
        wait_for(lambda: "mid" not in pods(cluster, namespace), 30, "mid gone")
        writer.submit(binder.clear_nomination(fresh)).result(timeout=30)  # deleted before its turn came
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a pod gone is nothing to warn of"
    finally:
        writer.close()
