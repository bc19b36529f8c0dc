"""Two `kubegpu scheduler` replicas on the real API server: at no time do both bind, whatever the write backlog.

The story each test tells: a tenant creates a few hundred pods no node can take (each costs the leader a
`FailedScheduling` Event and a `PodScheduled=False` patch, written at `--kube-api-qps 50`), then device pods the
cluster has room for. The writer's backlog grows to many seconds. The Lease must stay with the leader through it,
and when the leader really stops (paused here with SIGSTOP, as a starved or frozen process is), the Bindings it had
queued must never reach the API server after the standby took the Lease.

"Both act" is read from the API server itself: a watch records the resourceVersion at which each pod was bound and
at which the Lease changed hands (etcd orders every write in one sequence, so those versions compare), and the
replicas' logs say which of them posted each Binding. The Lease is shortened (4 s, renew deadline 3 s) to keep the
tests short; the backlog is several times longer than the lease.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3

from .cluster import Cluster, wait_for
from .conftest import SchedulerProcess
from .stall import StallingProxy
from .test_scheduler import P3, bound, devices_by_node

NAME = "ha-burst"
NODES, GPUS = 4, 8
FITTING = 40  # one-GPU pods: NODES * GPUS of them fit
LEASE = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"]
BOUND = re.compile(r'msg=(?:bound|"bound \(the answer was lost\)") pod=(\S+)')


class Recorder:
    """Watches the namespace's pods and Leases: the resourceVersion (and the time) at which each pod was first seen
    bound, and every change of the Lease's holder."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.bound: dict[str, tuple[int, float]] = {}  # pod name -> (resourceVersion, monotonic time seen)
        self.holders: list[tuple[int, float, str]] = []  # (resourceVersion, monotonic time seen, holder)
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._watch, args=(f"/api/v1/namespaces/{namespace}/pods", self._pod), daemon=True),
            threading.Thread(
                target=self._watch,
                args=(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", self._lease),
                daemon=True,
            ),
        ]

    def __enter__(self) -> Recorder:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()

    def _watch(self, path: str, record: Any) -> None:
        items, version = self.cluster.client.list(path)
        for item in items:
            record(item)
        while not self.stop.is_set():
            for event in self.cluster.client.watch(path, version, timeout=5):
                obj = event["object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    record(obj)
                if self.stop.is_set():
                    return

    def _pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName") and name not in self.bound:
            self.bound[name] = (int(pod["metadata"]["resourceVersion"]), time.monotonic())

    def _lease(self, lease: dict[str, Any]) -> None:
        holder = lease["spec"].get("holderIdentity") or ""
        if not self.holders or self.holders[-1][2] != holder:
            self.holders.append((int(lease["metadata"]["resourceVersion"]), time.monotonic(), holder))


def bindings_by(replica: SchedulerProcess) -> set[str]:
    return {key.split("/", 1)[1] for key in BOUND.findall(replica.output())}


def assert_never_both_bound(recorder: Recorder, one: SchedulerProcess, two: SchedulerProcess) -> None:
    """Every Binding a replica posted was stored while the Lease named that replica."""
    assert recorder.holders, "the watch never saw the Lease"
    for replica, identity in ((one, "one"), (two, "two")):
        late = []
        for pod in bindings_by(replica):
            version, seen = recorder.bound[pod]
            earlier = [change for change in recorder.holders if change[0] <= version]
            if not earlier or earlier[-1][2] != identity:
                since = f"{seen - earlier[-1][1]:.1f}s after {earlier[-1][2]} took the Lease" if earlier else "unled"
                late.append(f"{pod} ({since})")
        assert not late, f"{identity} bound {len(late)} pods while it did not hold the Lease: {sorted(late)[-5:]}"


def create_burst(cluster: Cluster, namespace: str, unschedulable: int) -> None:
    """The tenant's pods that fit nowhere (9 GPUs on 8-GPU nodes), then the device pods the cluster has room for."""
    for i in range(unschedulable):
        cluster.create_pod(namespace, f"big-{i:04d}", {"main": {"nvidia.com/gpu": 9}}, scheduler=NAME)
    for i in range(FITTING):
        cluster.create_pod(namespace, f"gpu-{i:02d}", {"main": {"nvidia.com/gpu": 1}}, scheduler=NAME)


def assert_no_device_held_twice(cluster: Cluster, namespace: str) -> None:
    placed = bound(cluster, namespace)
    for node, devices in devices_by_node(placed).items():
        doubles = [d for d, n in devices.items() if n > 1]
        assert not doubles, f"{node}: devices held by two pods: {doubles}"


@pytest.fixture
def replicas(cluster: Cluster, namespace: str, start_scheduler: Any) -> Iterator[tuple[SchedulerProcess, ...]]:
    for i in range(NODES):
        cluster.create_ready_node(f"p3-ha-{i}", labels=P3, allocatable={"nvidia.com/gpu": GPUS})
    timing = ["--lease-namespace", namespace, *LEASE]
    one = start_scheduler(NAME, *timing, "--identity", "one")
    one.wait_logged("became the leader")
    two = start_scheduler(NAME, *timing, "--identity", "two")
    http = urllib3.PoolManager()
    wait_for(
        lambda: http.request("GET", f"http://127.0.0.1:{two.metrics_port}/readyz", retries=False).status == 200,
        30,
        "the standby's informers to list the cluster",
    )
    yield one, two
    one.process.send_signal(signal.SIGCONT)  # a paused replica could not handle the fixture's SIGTERM


def test_a_burst_of_writes_neither_moves_the_lease_nor_lets_two_replicas_bind(
    cluster: Cluster, namespace: str, replicas: tuple[SchedulerProcess, SchedulerProcess]
) -> None:
    """About 800 writes owed to the rate limiter (16 s at 50 a second, four lease durations): the leader's
    renewals do not queue behind them, so the Lease stays where it is and the standby never binds."""
    one, two = replicas
    with Recorder(cluster, namespace) as recorder:
        create_burst(cluster, namespace, unschedulable=400)
        wait_for(lambda: len(bound(cluster, namespace)) >= NODES * GPUS, 120, "the device pods to be bound")

        def reported() -> bool:
            pods = cluster.pods(namespace)
            return all(any(c["type"] == "PodScheduled" for c in p["status"].get("conditions") or []) for p in pods)

        wait_for(reported, 120, "every pod's PodScheduled condition (the burst written out)")
    assert_never_both_bound(recorder, one, two)
    assert_no_device_held_twice(cluster, namespace)
    lease = cluster.client.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{NAME}")
    assert lease["spec"]["holderIdentity"] == "one", f"the burst moved the Lease: {recorder.holders}"
    assert lease["spec"].get("leaseTransitions", 0) == 0
    assert "became the leader" not in two.output()
    assert one.process.poll() is None, one.output()[-2000:]


def test_a_paused_leader_never_posts_its_queued_bindings_after_the_standby_took_over(
    cluster: Cluster, namespace: str, replicas: tuple[SchedulerProcess, SchedulerProcess]
) -> None:
    """The leader decides every device pod, its Bindings queued behind the burst's writes, and is frozen for longer
    than the lease. The standby takes over and binds; when the old leader resumes, its queue is refused unsent,
    and it exits."""
    one, two = replicas
    http = urllib3.PoolManager()

    def decided_by_one() -> float:
        text = http.request("GET", f"http://127.0.0.1:{one.metrics_port}/metrics").data.decode()
        found = re.search(r'kubegpu_scheduler_schedule_attempts_total\{result="scheduled"\} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    with Recorder(cluster, namespace) as recorder:
        create_burst(cluster, namespace, unschedulable=500)
        wait_for(lambda: decided_by_one() >= NODES * GPUS, 60, "the leader to decide every device pod")
        one.process.send_signal(signal.SIGSTOP)
        try:
            queued = NODES * GPUS - len(bound(cluster, namespace))
            assert queued > 0, "every Binding landed before the pause: the backlog was too short to test anything"
            wait_for(lambda: recorder.holders and recorder.holders[-1][2] == "two", 30, "the standby to take over")
        finally:
            one.process.send_signal(signal.SIGCONT)
        wait_for(lambda: one.process.poll() is not None, 30, "the old leader to exit")
        wait_for(lambda: len(bound(cluster, namespace)) >= NODES * GPUS, 60, "the device pods to be bound")
        wait_for(lambda: len(recorder.bound) >= NODES * GPUS, 10, "the watch to see every Binding")
    assert_never_both_bound(recorder, one, two)
    assert_no_device_held_twice(cluster, namespace)
    assert one.process.returncode == 1
    assert "stopped acting at the deadline" in one.output() or "lost the lease" in one.output()
    assert bindings_by(two), "the standby bound nothing after taking over"


def test_a_leader_told_to_stop_hands_the_lease_over_at_once_and_binds_nothing_after(
    cluster: Cluster, namespace: str, replicas: tuple[SchedulerProcess, SchedulerProcess]
) -> None:
    """A rollout or a node drain sends the leader SIGTERM while it binds, with writes queued behind the rate limiter.
    It stops deciding and sending, waits for the writes it sent to be answered, and releases the Lease: the standby
    leads well within the lease duration (it used to wait all of it, 4 s here, 15 s by default), and no pod is bound
    twice, no Binding of the old leader is stored after the handover, no device is given twice."""
    one, two = replicas
    with Recorder(cluster, namespace) as recorder:
        create_burst(cluster, namespace, unschedulable=150)
        wait_for(lambda: len(recorder.bound) >= 4, 60, "the leader to bind a few device pods")
        terminated = time.monotonic()
        one.process.send_signal(signal.SIGTERM)
        wait_for(lambda: recorder.holders[-1][2] == "two", 30, "the standby to take the Lease")
        handover = recorder.holders[-1][1] - terminated
        wait_for(lambda: one.process.poll() is not None, 30, "the old leader to exit")
        wait_for(lambda: len(bound(cluster, namespace)) >= NODES * GPUS, 60, "the device pods to be bound")
        wait_for(lambda: len(recorder.bound) >= NODES * GPUS, 10, "the watch to see every Binding")
    assert handover < 2.0, f"the standby led {handover:.1f}s after the SIGTERM (lease: 4 s): {recorder.holders}"
    assert [holder for _, _, holder in recorder.holders] == ["one", "", "two"], recorder.holders
    assert one.process.returncode == 0, one.output()[-2000:]
    assert "released the lease" in one.output()
    assert_never_both_bound(recorder, one, two)
    by_one, by_two = bindings_by(one), bindings_by(two)
    assert by_one and by_two, f"the handover happened outside the binding: {len(by_one)} then {len(by_two)}"
    assert not by_one & by_two, f"bound by both replicas: {sorted(by_one & by_two)}"
    assert by_one | by_two == set(bound(cluster, namespace)), "a pod bound by neither replica's log"
    assert_no_device_held_twice(cluster, namespace)


def test_a_new_leader_counts_the_bindings_its_lagging_pod_watch_has_not_delivered(
    cluster: Cluster, namespace: str, start_scheduler: Any, tmp_path: Any
) -> None:
    """A 5-GPU pod waits for a node of pool b. The standby's pod watch falls behind (held in a proxy, as a half-open
    connection or a lagging API server leaves it); the leader binds another 5-GPU pod on the one 8-GPU node, which
    then joins pool b. The leader dies and the standby takes over, its watch still silent about that Binding: it must
    count the bound pod's GPUs before it decides, so the waiting pod still waits, instead of being given GPUs the
    bound one holds."""
    cluster.create_ready_node("p3-late", labels={**P3, "pool": "a"}, allocatable={"nvidia.com/gpu": GPUS})
    proxy = StallingProxy(cluster)
    timing = ["--lease-namespace", namespace, *LEASE]
    try:
        one = start_scheduler(NAME, *timing, "--identity", "one")
        one.wait_logged("became the leader")
        two = start_scheduler(
            NAME, *timing, "--identity", "two", kubeconfig=proxy.kubeconfig(cluster, tmp_path / "proxied")
        )
        gpus = {"main": {"nvidia.com/gpu": 5}}
        cluster.create_pod(namespace, "waiting", gpus, scheduler=NAME, node_selector={"pool": "b"})
        wait_for(lambda: pending_in(two) >= 1, 30, "the standby to see the pod waiting")
        wait_for(lambda: proxy.held_watches > 0, 30, "the standby's pod watch to go through the proxy")
        proxy.hold()
        cluster.create_pod(namespace, "bound", gpus, scheduler=NAME)
        wait_for(lambda: "bound" in bound(cluster, namespace), 30, "the leader to bind the other pod")
        cluster.client.patch("/api/v1/nodes/p3-late", {"metadata": {"labels": {"pool": "b"}}})
        one.kill()
        two.wait_logged("became the leader", timeout=30)
        wait_for(
            lambda: "waiting" in bound(cluster, namespace) or refusals_by(two) >= 1,
            30,
            "the new leader to try the waiting pod",
        )
        assert_no_device_held_twice(cluster, namespace)
        assert set(bound(cluster, namespace)) == {"bound"}, "the new leader bound the waiting pod beside the other"
    finally:
        proxy.close()


def scraped(replica: SchedulerProcess, pattern: str) -> float:
    http = urllib3.PoolManager()
    text = http.request("GET", f"http://127.0.0.1:{replica.metrics_port}/metrics", retries=False).data.decode()
    return sum(float(value) for value in re.findall(pattern, text))


def pending_in(replica: SchedulerProcess) -> float:
    """The pods the replica's queue holds (a standby's queue follows the cluster too)."""
    return scraped(replica, r'kubegpu_scheduler_pending_pods\{queue="(?:active|backoff|unschedulable)"\} (\S+)')


def refusals_by(replica: SchedulerProcess) -> float:
    """The scheduling cycles in which the replica found no node for a pod."""
    return scraped(replica, r'kubegpu_scheduler_schedule_attempts_total\{result="unschedulable"\} (\S+)')


@pytest.mark.parametrize("edit", ["deleted", "shortened to 1 s", "holder cleared"])
def test_a_lease_edited_by_hand_while_the_leader_stalls_stays_with_the_leader(
    cluster: Cluster, namespace: str, replicas: tuple[SchedulerProcess, SchedulerProcess], edit: str
) -> None:
    """The leader is frozen for 2 s (a GC pause, a starved CPU), less than its renew deadline, so it still acts once
    it resumes; meanwhile someone edits its Lease by hand. The standby must not take the Lease on that account: it
    would bind beside a leader that goes on binding until its next renewal. It used to take a deleted or cleared
    Lease at once, and one whose leaseDurationSeconds was shortened after that many seconds."""
    one, two = replicas
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{NAME}"
    with Recorder(cluster, namespace) as recorder:
        one.process.send_signal(signal.SIGSTOP)
        try:
            if edit == "deleted":
                cluster.client.delete(path)
            elif edit == "holder cleared":
                cluster.client.patch(path, {"spec": {"holderIdentity": None}})
            else:
                cluster.client.patch(path, {"spec": {"leaseDurationSeconds": 1}})
            time.sleep(2.0)  # four of the standby's retry periods; the leader's renew deadline is 3 s
        finally:
            one.process.send_signal(signal.SIGCONT)
        time.sleep(2.0)  # the leader renews again
    assert "became the leader" not in two.output(), f"the standby took the Lease: {recorder.holders}"
    assert one.process.poll() is None, one.output()[-2000:]
    lease = cluster.client.get(path)
    assert lease["spec"]["holderIdentity"] == "one"
    assert {holder for _, _, holder in recorder.holders if holder} == {"one"}, recorder.holders


def test_a_leader_restarted_under_the_same_identity_waits_out_its_previous_lease(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    """A container restarted in its pod has the same default identity (the pod's hostname, pid 1). The killed
    process's last writes may still be on their way; its successor must wait the lease duration, as any other
    replica would, instead of finding the Lease "its own" and deciding at once."""
    timing = ["--lease-namespace", namespace, *LEASE]
    first = start_scheduler(NAME, *timing, "--identity", "same")
    first.wait_logged("became the leader")
    first.kill()
    started = time.monotonic()
    second = start_scheduler(NAME, *timing, "--identity", "same")
    second.wait_logged("became the leader", timeout=30)
    took = time.monotonic() - started
    assert took >= 4.0, f"the restarted replica took its predecessor's Lease after {took:.1f}s (lease: 4 s)"
