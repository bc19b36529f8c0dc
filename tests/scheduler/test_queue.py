"""The custom scheduler's queue, as kube-scheduler's: backoff per attempt, and unschedulable pods brought back by the
cluster events that can help them, not by any event and not in a loop.

The scheduler runs without a cluster (as in test_service_guards.py): informer events are handed to its mirror directly
and a recording writer stands in for the API server. The clock is the queue's `time.monotonic`, moved by the test.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import DEVICES_KEY, FOREIGN_DEVICES_KEY, encode_devices, encode_foreign_devices
from kubegpu.core.manifests import node_info
from kubegpu.core.models import (
    DeviceInfo,
    DeviceInventory,
    LabelSelector,
    NodeDevices,
    NodeInfo,
    PodRequest,
    Requirement,
    Taint,
    Toleration,
)
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_pod, node_manifest, pod_manifest
from kubegpu.kube.client import ApiError
from kubegpu.scheduler import queue
from kubegpu.scheduler.config import parse_config
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.filters import node_change_may_help
from kubegpu.scheduler.scores import PREFER_AVOID_KEY

from .test_service_guards import KEY, RecordingWriter

ZONE = "topology.kubernetes.io/zone"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(queue.time, "monotonic", fake)
    return fake


@pytest.fixture
def service(clock: Clock) -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    svc.mirror.on_nodes("SYNC", [node_manifest("n1", labels={ZONE: "a"}, cpu="2")])
    svc.mirror.on_pods("SYNC", [])
    return svc


def pod(name: str, cpu: str = "1", *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    manifest = pod_manifest(name, {"main": {"cpu": cpu}}, scheduler_name="kubegpu")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1", labels=labels or {})
    manifest["spec"].update(spec)
    return manifest


def bound(name: str, node: str, cpu: str = "1", **meta: Any) -> dict[str, Any]:
    manifest = pod(name, cpu, **meta)
    manifest["spec"]["nodeName"] = node
    manifest["spec"]["schedulerName"] = "someone-else"
    return manifest


def run_once(service: CustomScheduler) -> None:
    """One turn of the loop: due pods promoted, the active ones scheduled, binding results applied."""
    service.queue.promote()
    service.schedule_active(100)
    while not service.mirror.events.empty():
        service.mirror.handle(service.mirror.events.get_nowait())


def waiting(service: CustomScheduler) -> dict[str, str]:
    where = {key: "unschedulable" for key in service.queue.unschedulable}
    where.update({entry.key: "backoff" for entry in service.queue.backoff})
    where.update({key: "active" for key in service.queue.active})
    return where


def test_backoff_doubles_per_attempt_from_one_second_to_ten(service: CustomScheduler, clock: Clock) -> None:
    service.mirror.on_pods("ADDED", pod("big", cpu="4"))
    waits = []
    for _ in range(6):
        run_once(service)
        entry = service.queue.unschedulable["default/big"]
        waits.append(entry.ready_at - clock.now)
        service.queue.wake()  # as if the cluster changed each time: the pod still waits out its backoff
        clock.now = entry.ready_at
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_pod_waiting_for_its_victims_to_leave_keeps_its_first_backoff(service: CustomScheduler, clock: Clock) -> None:
    """A pod that preempted fits nowhere until its victims are gone; the attempts made while they leave do not
    double its backoff (a slow API server would otherwise make it wait 2, 4, 8 s after they left)."""
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    waits = []
    for _ in range(4):
        run_once(service)
        entry = service.queue.unschedulable["default/big"]
        waits.append(entry.ready_at - clock.now)
        service.queue.wake()
        clock.now = entry.ready_at
    assert service.engine.nominated == {"default/big": "n1"}
    assert waits == [1.0, 1.0, 1.0, 1.0]


class OverlapWriter(RecordingWriter):
    """A recording writer whose every request yields to the event loop once, counting the requests in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight: dict[str, int] = {}

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        self.in_flight += 1
        self.most_in_flight[method] = max(self.most_in_flight.get(method, 0), self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return await super().request(method, path, body, content_type)


def test_a_preemption_deletes_its_victims_at_once_before_its_other_writes(
    service: CustomScheduler, clock: Clock
) -> None:
    """The victims' deletions are what the preemptor waits for: they are sent first and together, not one after
    another behind the Events and the nominated node (each write waits its turn behind every other pod's writes, so
    seven writes in a row kept victims on a busy cluster for seconds)."""
    writer = OverlapWriter()
    service.binder.writer = writer  # type: ignore[assignment]
    service.mirror.server_version = (1, 31)  # victims marked DisruptionTarget first, both at once
    for name in ("low-a", "low-b"):
        service.mirror.on_pods("ADDED", bound(name, "n1", cpu="1"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    # Each victim's DisruptionTarget mark, then its deletion (kube-scheduler 1.26+'s order), both victims at once.
    first_other = next(i for i, (_, path, _) in enumerate(writer.writes) if "/pods/low-" not in path)
    assert sorted(method for method, _, _ in writer.writes[:first_other]) == ["DELETE", "DELETE", "PATCH", "PATCH"]
    assert writer.most_in_flight["PATCH"] == 2 and writer.most_in_flight["DELETE"] == 2
    assert len(writer.events("Preempted")) == 2
    assert service.engine.nominated == {"default/big": "n1"}


class RefusingDeletes(RecordingWriter):
    """A recording writer whose first `refusals` DELETEs the API server answers 500 (the victim stays)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if method == "DELETE" and self.refusals > 0:
            self.refusals -= 1
            self.writes.append(("DELETE-REFUSED", path, body))
            raise ApiError(500, "InternalError", "etcdserver: request timed out")
        return await super().request(method, path, body, content_type)


class RefusingMarks(RecordingWriter):
    """A recording writer whose API server refuses every status patch of the victim `low` with a 403 (a role
    without `pods/status` patch)."""

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if method == "PATCH" and path.endswith("/pods/low/status"):
            self.writes.append(("PATCH-REFUSED", path, body))
            raise ApiError(403, "Forbidden", 'pods "low" is forbidden: cannot patch resource "pods/status"')
        return await super().request(method, path, body, content_type)


@pytest.mark.parametrize("refused", [False, True], ids=["marked", "mark-refused"])
def test_a_victim_is_marked_disruption_target_then_deleted(
    service: CustomScheduler, clock: Clock, refused: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-scheduler 1.26+ writes the condition `DisruptionTarget=True` (reason `PreemptionByScheduler`) on each
    victim before deleting it, so that a Job whose `podFailurePolicy` ignores disruptions does not count the
    preempted pod against its `backoffLimit`. A mark the API server refuses is logged, and the victim is deleted
    all the same: the preemptor must not wait on it."""
    service.mirror.server_version = (1, 31)
    service.binder.writer = writer = RefusingMarks() if refused else RecordingWriter()  # type: ignore[assignment]
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    victim = [(m, body) for m, path, body in writer.writes if path.startswith("/api/v1/namespaces/default/pods/low")]
    assert [m for m, _ in victim] == ["PATCH-REFUSED" if refused else "PATCH", "DELETE"]
    (condition,) = victim[0][1]["status"]["conditions"]
    assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "kubegpu: preempting to accommodate a higher priority pod",
    }
    assert victim[1][1]["preconditions"] == {"uid": "uid-low"}
    assert ("could not mark a preemption victim" in caplog.text) == refused


@pytest.mark.parametrize(
    ("version", "mode", "marked"),
    [((1, 25), "auto", False), ((1, 26), "auto", True), (None, "auto", False), ((1, 20), "on", True),
     ((1, 34), "off", False)],
    ids=["1.25", "1.26", "unknown", "1.20-on", "1.34-off"],
)  # fmt: skip
def test_victims_are_marked_where_kube_scheduler_marks_its_own_or_as_the_operator_says(
    service: CustomScheduler, clock: Clock, version: tuple[int, int] | None, mode: str, marked: bool
) -> None:
    """`--disruption-conditions auto` marks on an API server of 1.26 or later, where kube-scheduler marks its own
    victims and the Job controller reads the mark; before, no controller reads it and each mark is one more write
    (a third more per preemption: `scheduler_perf_bench.py`'s Preemption workload ran a third slower for them)."""
    from kubegpu.scheduler.binder import marks_victims

    service.mirror.server_version = version
    service.binder.marks = marks_victims(mode, lambda: service.mirror.server_version)
    service.binder.writer = writer = RecordingWriter()  # type: ignore[assignment]
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    victim = [m for m, path, _ in writer.writes if path.startswith("/api/v1/namespaces/default/pods/low")]
    assert victim == (["PATCH", "DELETE"] if marked else ["DELETE"])


def test_a_victim_whose_deletion_failed_is_not_waited_for(service: CustomScheduler, clock: Clock) -> None:
    """One failed deletion (a 500, a dropped connection) kept its victim counted as leaving for as long as the
    victim ran: the preemptor waited for it, never preempting again nor, since it waits, reported again. The victim
    is still there: the preemptor's next try preempts it again."""
    service.binder.writer = writer = RefusingDeletes(1)  # type: ignore[assignment]
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    assert [m for m, p, _ in writer.writes if "DELETE" in m] == ["DELETE-REFUSED"]
    for _ in range(3):  # the cluster changes (or the backoff ends): the preemptor is tried again
        service.queue.wake()
        clock.now += 10.0
        run_once(service)
    assert [m for m, p, _ in writer.writes if "DELETE" in m] == ["DELETE-REFUSED", "DELETE"]


def test_a_pod_waiting_for_its_victims_is_not_reported_again(service: CustomScheduler, clock: Clock) -> None:
    """While its victims leave, a preempting pod tried again (another change woke it) fits nowhere yet: its
    `FailedScheduling` Event and condition already say so, and its nominated node where it waits. Writing them again
    for each such try put the victims' own deletions behind thousands of reports on a busy cluster."""
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    assert len(writer.events("FailedScheduling")) == 1
    service.mirror.on_nodes("ADDED", node_manifest("n2", cpu="1"))  # wakes it; changes its message's count
    assert waiting(service) == {"default/big": "backoff"}
    clock.now += 1.0
    run_once(service)  # tried again: still nowhere to go while "low" is leaving
    assert waiting(service) == {"default/big": "unschedulable"}
    assert service.engine.nominated == {"default/big": "n1"}
    assert len(writer.events("FailedScheduling")) == 1
    conditions = [path for _, path, body in writer.writes if path.endswith("/status") and "PodScheduled" in str(body)]
    assert len(conditions) == 1


def test_a_pod_waiting_for_its_victims_is_tried_without_explaining_the_nodes_passed_over(
    service: CustomScheduler, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its refusal is not reported while its victims leave, so its cycle filters only what the capacity index offers
    (each explanation asks again every node held for a preemptor: on 1,000 nodes with hundreds held, most of a
    preempting workload's scheduling time). It still binds where room appears."""
    explained: list[str] = []
    explain = service.engine._explain_skipped
    monkeypatch.setattr(
        service.engine, "_explain_skipped", lambda pod, *rest: explained.append(pod.name) or explain(pod, *rest)
    )
    # The walk node by node, as for a pod whose answers the shape's memo cannot give (`sampling.py`): a pod of a
    # remembered shape is refused from the remembered answers, which count every node without explaining.
    monkeypatch.setattr(service.engine, "_every_node_by_shape", lambda *args: None)
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    assert explained == ["big"]
    service.mirror.on_nodes("ADDED", node_manifest("n2", cpu="1"))
    clock.now += 1.0
    run_once(service)  # waiting: tried, not explained
    assert explained == ["big"]
    assert waiting(service) == {"default/big": "unschedulable"}
    service.mirror.on_nodes("ADDED", node_manifest("n3", cpu="4"))  # room elsewhere
    clock.now += 1.0
    run_once(service)
    assert service.binder.writer.bindings() == ["big"]  # type: ignore[attr-defined]


def test_the_configured_backoff_is_used(service: CustomScheduler, clock: Clock) -> None:
    service.queue.initial_backoff, service.queue.max_backoff = 2.0, 5.0
    service.mirror.on_pods("ADDED", pod("big", cpu="4"))
    waits = []
    for _ in range(3):
        run_once(service)
        entry = service.queue.unschedulable["default/big"]
        waits.append(entry.ready_at - clock.now)
        service.queue.wake()
        clock.now = entry.ready_at
    assert waits == [2.0, 4.0, 5.0]


def test_an_unrelated_pod_added_leaves_an_unschedulable_pod_waiting(service: CustomScheduler, clock: Clock) -> None:
    service.mirror.on_pods("ADDED", pod("big", cpu="4"))
    run_once(service)
    service.mirror.on_pods("ADDED", bound("other", "n1", cpu="100m", labels={"app": "db"}))
    assert waiting(service) == {"default/big": "unschedulable"}


@pytest.mark.parametrize(
    "event",
    ["node-added", "node-changed", "pod-deleted", "pod-finished"],
)
def test_events_that_free_or_add_room_bring_unschedulable_pods_back(
    service: CustomScheduler, clock: Clock, event: str
) -> None:
    service.mirror.on_pods("ADDED", bound("holder", "n1", cpu="1"))
    service.mirror.on_pods("ADDED", pod("wants-two", cpu="2"))
    run_once(service)
    assert waiting(service) == {"default/wants-two": "unschedulable"}
    if event == "node-added":
        service.mirror.on_nodes("ADDED", node_manifest("n2", cpu="4"))
    elif event == "node-changed":
        service.mirror.on_nodes("MODIFIED", node_manifest("n1", labels={ZONE: "a"}, cpu="8"))
    elif event == "pod-deleted":
        service.mirror.on_pods("DELETED", bound("holder", "n1", cpu="1"))
    else:
        finished = bound("holder", "n1", cpu="1")
        finished["status"] = {"phase": "Succeeded"}
        service.mirror.on_pods("MODIFIED", finished)
    assert waiting(service) == {"default/wants-two": "backoff"}
    clock.now += 1.0
    run_once(service)
    assert service.binder.writer.bindings() == ["wants-two"]  # type: ignore[attr-defined]


def affinity_to(labels: dict[str, str]) -> dict[str, Any]:
    term = {"topologyKey": ZONE, "labelSelector": {"matchLabels": labels}}
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def test_a_pod_added_that_its_affinity_selects_brings_it_back(service: CustomScheduler, clock: Clock) -> None:
    service.mirror.on_pods("ADDED", pod("follower", "100m", labels={"app": "web"}, affinity=affinity_to({"app": "db"})))
    run_once(service)
    assert waiting(service) == {"default/follower": "unschedulable"}
    service.mirror.on_pods("ADDED", bound("cache", "n1", "100m", labels={"app": "cache"}))
    assert waiting(service) == {"default/follower": "unschedulable"}, "a pod it does not select does not help"
    service.mirror.on_pods("ADDED", bound("db", "n1", "100m", labels={"app": "db"}))
    assert waiting(service) == {"default/follower": "backoff"}
    clock.now += 1.0
    run_once(service)
    assert service.binder.writer.bindings() == ["follower"]  # type: ignore[attr-defined]


def test_a_pod_kubegpu_itself_places_brings_back_pods_drawn_to_it(service: CustomScheduler, clock: Clock) -> None:
    service.mirror.on_pods("ADDED", pod("follower", "100m", labels={"app": "web"}, affinity=affinity_to({"app": "db"})))
    run_once(service)
    service.mirror.on_pods("ADDED", pod("db", "100m", labels={"app": "db"}))
    run_once(service)
    assert waiting(service) == {"default/follower": "backoff"}
    clock.now += 1.0
    run_once(service)
    assert service.binder.writer.bindings() == ["db", "follower"]  # type: ignore[attr-defined]


def test_a_changed_pending_pod_is_tried_again(service: CustomScheduler, clock: Clock) -> None:
    service.mirror.on_pods("ADDED", pod("big", cpu="4"))
    run_once(service)
    service.mirror.on_pods("MODIFIED", pod("big", cpu="4"))
    assert waiting(service) == {"default/big": "unschedulable"}, "the same pod again is no news"
    service.mirror.on_pods("MODIFIED", pod("big", cpu="1"))
    assert waiting(service) == {"default/big": "backoff"}
    clock.now += 1.0
    run_once(service)
    assert service.binder.writer.bindings() == ["big"]  # type: ignore[attr-defined]


def test_a_pod_nothing_helps_is_tried_again_after_a_minute_not_sooner(service: CustomScheduler, clock: Clock) -> None:
    service.mirror.on_pods("ADDED", pod("big", cpu="4"))
    run_once(service)
    clock.now += 30.0
    service.mirror.on_pods("ADDED", pod("late", cpu="4"))
    run_once(service)
    clock.now += 31.0
    run_once(service)  # big, unschedulable for 61 s, goes back through the backoff heap
    run_once(service)
    assert waiting(service) == {"default/big": "unschedulable", "default/late": "unschedulable"}
    assert service.queue.unschedulable["default/big"].attempts == 2, "big was tried again after 60 s; late was not"
    assert service.queue.unschedulable["default/late"].attempts == 1


def spread_service(clock: Clock, constraint: dict[str, Any]) -> CustomScheduler:
    """A scheduler whose profile spreads the pods a Service selects by `constraint` (PodTopologySpread's
    defaultConstraints), over n1 in zone a (2 cpu) and n2 in zone b (1 cpu)."""
    document = {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "kubegpu",
                "pluginConfig": [{"name": "PodTopologySpread", "args": {"defaultConstraints": [constraint]}}],
            }
        ],
    }
    config = parse_config(document)
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY,
                    scoring=config.profile)  # fmt: skip
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    engine.set_owner("Service", "default", "web", LabelSelector((Requirement("app", "In", ("web",)),)))
    svc.mirror.on_nodes(
        "SYNC", [node_manifest("n1", labels={ZONE: "a"}, cpu="2"), node_manifest("n2", labels={ZONE: "b"}, cpu="1")]
    )
    svc.mirror.on_pods("SYNC", [bound("web-0", "n1", labels={"app": "web"}), bound("filler", "n2")])
    return svc


@pytest.mark.parametrize(("when", "woken"), [("DoNotSchedule", True), ("ScheduleAnyway", False)])
def test_a_pod_its_default_spread_counts_brings_it_back_when_that_can_refuse_nodes(
    clock: Clock, when: str, woken: bool
) -> None:
    # web-1 fits no node: n2 is full, and on n1 zone a would hold 2 of the Service's pods against zone b's 0 (maxSkew
    # 1, a DoNotSchedule default). A web pod placed in zone b can change that; a ScheduleAnyway default refuses no
    # node, so its pods are no news for a pod that waits.
    svc = spread_service(clock, {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": when})
    svc.mirror.on_pods("ADDED", pod("web-1", "1", labels={"app": "web"}))
    run_once(svc)
    if not woken:
        assert svc.binder.writer.bindings() == ["web-1"]  # type: ignore[attr-defined]  # nothing refused it
        svc.mirror.on_pods("ADDED", pod("web-2", "2", labels={"app": "web"}))  # too big for any node now
        run_once(svc)
        svc.mirror.on_pods("ADDED", bound("web-3", "n2", "0", labels={"app": "web"}))
        assert waiting(svc) == {"default/web-2": "unschedulable"}
        return
    assert waiting(svc) == {"default/web-1": "unschedulable"}
    svc.mirror.on_pods("ADDED", bound("web-2", "n2", "0", labels={"app": "web"}))  # another scheduler's, in zone b
    assert waiting(svc) == {"default/web-1": "backoff"}
    clock.now += 1.0
    run_once(svc)
    assert svc.binder.writer.bindings() == ["web-1"]  # type: ignore[attr-defined]


# What a node change may do to pods that fit nowhere, as kube-scheduler 1.20's nodeSchedulingPropertiesChange judges
# it: only a change to what the filters read (allocatable, labels, taints, unschedulable lifted, Ready regained, the
# advertised inventory) can make such a pod fit. Images and annotations feed scores (ImageLocality,
# NodePreferAvoidPods), which rank the nodes a pod fits and never make it fit one.
TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
INVENTORY = NodeDevices(inventories={"neuron": DeviceInventory(plugin="neuron", devices=[DeviceInfo(id="0")])})
AVOID = {"preferAvoidPods": [{"podSignature": {"podController": {"kind": "ReplicaSet", "uid": "u1"}}}]}


def with_images(node: dict[str, Any]) -> None:
    node["status"]["images"] = [{"names": ["registry.example/app:1"], "sizeBytes": 500_000_000}]


def annotated(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    return lambda node: node["metadata"]["annotations"].__setitem__(key, value)


def ready(status: str) -> Callable[[dict[str, Any]], None]:
    return lambda node: node["status"].__setitem__("conditions", [{"type": "Ready", "status": status}])


def unschedulable(value: bool) -> Callable[[dict[str, Any]], None]:
    return lambda node: node["spec"].__setitem__("unschedulable", value)


def nothing(node: dict[str, Any]) -> None:
    pass


NODE_CHANGES = [
    # (id, the node before, the node after, whether the pods waiting are tried again)
    ("image-pulled", nothing, with_images, False),
    ("annotation-added", nothing, annotated("example.com/owner", "team-a"), False),
    ("prefer-avoid-pods", nothing, annotated(PREFER_AVOID_KEY, json.dumps(AVOID)), False),
    (
        "foreign-devices-of-no-pod-kubegpu-counts",
        nothing,
        annotated(FOREIGN_DEVICES_KEY, encode_foreign_devices({})),
        False,
    ),
    (
        "heartbeat",
        nothing,
        lambda node: node["status"]["conditions"][0].update(lastHeartbeatTime="2026-01-01T00:00:00Z"),
        False,
    ),
    ("cordoned", nothing, unschedulable(True), False),
    ("not-ready", nothing, ready("False"), False),
    ("allocatable-grows", nothing, lambda node: node["status"]["allocatable"].update(cpu="8"), True),
    ("label-added", nothing, lambda node: node["metadata"]["labels"].update(disktype="ssd"), True),
    (
        "taint-removed",
        lambda node: node["spec"].update(taints=[TAINT]),
        lambda node: node["spec"].update(taints=[]),
        True,
    ),
    ("uncordoned", unschedulable(True), unschedulable(False), True),
    ("ready-again", ready("False"), ready("True"), True),
    ("inventory-advertised", nothing, annotated(DEVICES_KEY, encode_devices(INVENTORY)), True),
]


@pytest.mark.parametrize(
    ("before", "after", "woken"), [row[1:] for row in NODE_CHANGES], ids=[r[0] for r in NODE_CHANGES]
)
def test_a_node_change_brings_back_the_unschedulable_pods_only_when_it_can_help(
    clock: Clock,
    before: Callable[[dict[str, Any]], None],
    after: Callable[[dict[str, Any]], None],
    woken: bool,
) -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
    svc = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    node = node_manifest("n1", labels={ZONE: "a"}, cpu="2")
    before(node)
    svc.mirror.on_nodes("SYNC", [node])
    svc.mirror.on_pods("SYNC", [pod(f"big-{i}", cpu="4") for i in range(3)])
    run_once(svc)
    assert set(waiting(svc).values()) == {"unschedulable"}
    changed = copy.deepcopy(node)
    after(changed)
    svc.mirror.on_nodes("MODIFIED", changed)
    assert engine.node_info("n1") == node_info(changed), "the engine sees the node as it is now, woken or not"
    assert list(waiting(svc).values()) == ["backoff" if woken else "unschedulable"] * 3


TOLERATIONS = {
    "none": (),
    "dedicated": (Toleration("dedicated", "Equal", "ml", "NoSchedule"),),
    "cordon": (Toleration("node.kubernetes.io/unschedulable", "Exists", None, "NoSchedule"),),
    "everything": (Toleration(None, "Exists"),),
}
NODE_FIELDS = {
    "labels": st.sampled_from([{}, {"disktype": "ssd"}, {"disktype": "hdd"}]),
    "annotations": st.sampled_from([{}, {"example.com/owner": "a"}, {PREFER_AVOID_KEY: json.dumps(AVOID)}]),
    "allocatable": st.sampled_from([{"cpu": 2000, "pods": 110}, {"cpu": 4000, "pods": 110}, {"cpu": 4000, "pods": 0}]),
    "taints": st.sampled_from(
        [(), (Taint("dedicated", "ml", "NoSchedule"),), (Taint("dedicated", "ml", "NoExecute"),)]
    ),
    "unschedulable": st.sampled_from([False, False, True]),
    "ready": st.sampled_from([True, True, False]),
    "images": st.sampled_from([{}, {"registry.example/app:1": 500_000_000}]),
}
NO_PLUGINS = make_plugin_manager("scheduler", plugins=(), autoload=False)
pods = st.builds(
    lambda cpu, selector, tolerations: replace(
        make_pod("p", {"main": {"cpu": cpu}}, node_selector=selector), tolerations=TOLERATIONS[tolerations]
    ),
    st.sampled_from(["1", "3"]),
    st.sampled_from([{}, {"disktype": "ssd"}]),
    st.sampled_from(["none", "none", "dedicated", "cordon", "everything"]),
)


def fits(node: NodeInfo, pod: PodRequest) -> bool:
    engine = Engine(NO_PLUGINS, signing_key=KEY)
    engine.add_node(node)
    return engine.schedule(pod).scheduled


@settings(max_examples=1000, deadline=None)
@given(before=st.fixed_dictionaries(NODE_FIELDS), data=st.data(), pod=pods)
def test_a_node_change_judged_unhelpful_never_lets_a_pod_that_fit_nowhere_fit(
    before: dict[str, Any], data: st.DataObject, pod: PodRequest
) -> None:
    # The node after: each field as it was or drawn again (so most changes touch a field or two).
    changed = data.draw(st.sets(st.sampled_from(sorted(NODE_FIELDS)), min_size=1, max_size=2), label="changed")
    after = {**before, **{name: data.draw(NODE_FIELDS[name], label=name) for name in sorted(changed)}}
    old, new = NodeInfo(name="n1", **before), NodeInfo(name="n1", **after)
    assume(node_change_may_help(old, new) is None)
    assert fits(old, pod) or not fits(new, pod)


def test_a_preemptor_gone_while_the_watch_was_down_leaves_its_node_held_for_nobody(
    service: CustomScheduler, clock: Clock
) -> None:
    """A preempting pod deleted while the pod watch was down is gone from the relist: its node was held for it
    still (`Engine.nominate`), and every pod of lower or equal priority stayed off that node for as long as the
    scheduler ran, told `node(s) were nominated for a pending pod`. The relist now releases it with the pod."""
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    assert len(writer.events("Preempted")) == 1
    service.mirror.on_pods("SYNC", [])  # the relist: "low" (the victim) and "big" both gone meanwhile
    service.mirror.on_pods("ADDED", pod("next", cpu="2", priority=5))
    clock.now += 1.0
    run_once(service)
    assert writer.bindings() == ["next"]


def test_a_preemptor_made_again_while_the_watch_was_down_is_a_new_pod_with_no_nomination(
    service: CustomScheduler, clock: Clock
) -> None:
    """`big` preempted `low` and was nominated on n1; while the pod watch was down `big` was deleted and made again
    under its name (a controller's new pod, another UID). The relist showed the new `big`, which inherited the old
    one's hold on n1 (the old request counted there) and its queue entry: it waited for the old pod's victim, told
    nothing, its `status.nominatedNodeName` never set. It is a new pod: tried afresh, told why it waits, and nominated
    in its own name."""
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    assert [e["involvedObject"]["uid"] for e in writer.events("FailedScheduling")] == ["uid-big"]
    terminating = bound("low", "n1", cpu="2")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    again = pod("big", cpu="2", priority=10)
    again["metadata"]["uid"] = "uid-big-2"
    service.mirror.on_pods("SYNC", [terminating, again])
    clock.now += 1.0
    run_once(service)
    told = [(e["involvedObject"]["uid"], e["message"]) for e in writer.events("FailedScheduling")]
    assert [uid for uid, _ in told] == ["uid-big", "uid-big-2"], told
    assert told[1][1] == "0/1 nodes are available: 1 Insufficient cpu.", "told why, not a bare count"
    nominations = [
        b for m, p, b in writer.writes if p.endswith("/pods/big/status") and "nominatedNodeName" in b["status"]
    ]
    assert [(b["metadata"]["uid"], b["status"]["nominatedNodeName"]) for b in nominations][-1] == ("uid-big-2", "n1")


def test_a_preemptor_that_no_longer_finds_victims_has_its_nomination_cleared(
    service: CustomScheduler, clock: Clock
) -> None:
    """`big` preempted `low` and was nominated on n1. Once `low` was gone, a pod of higher priority took n1 (bound
    there by another scheduler): `big` fits nowhere and finds no victims. The engine let n1 go, but `big` kept its
    `status.nominatedNodeName: n1`, telling its owner (and a cluster autoscaler, which counts a nominated pod as
    placed) that it would run there. kube-scheduler clears the nomination of a pod whose preemption finds nothing."""
    service.mirror.on_pods("ADDED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", pod("big", cpu="2", priority=10))
    run_once(service)
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]

    def nominations() -> list[str | None]:
        return [b["status"]["nominatedNodeName"] for m, p, b in writer.writes if p.endswith("/pods/big/status")
                and "nominatedNodeName" in b["status"]]  # fmt: skip

    assert nominations() == ["n1"]
    service.mirror.on_pods("DELETED", bound("low", "n1", cpu="2"))
    service.mirror.on_pods("ADDED", bound("vip", "n1", cpu="2", priority=1000))
    clock.now += 1.0
    run_once(service)
    assert service.engine.nominated_node("default/big") is None
    assert nominations() == ["n1", None]
    clock.now += 2.0
    service.queue.wake()
    run_once(service)
    assert nominations() == ["n1", None], "cleared once"


@pytest.mark.parametrize(
    ("version", "cpu", "preemption"),
    [
        ((1, 20), "2", ""),
        ((1, 21), "2", ""),
        (None, "2", ""),  # not known yet: as the oldest
        ((1, 22), "2", " preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."),
        ((1, 31), "4", " preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."),
    ],
    ids=["1.20", "1.21", "unknown", "1.22-no-victims", "1.31-not-helpful"],
)
def test_failed_scheduling_tells_the_preemption_as_kube_scheduler_of_the_servers_release_does(
    service: CustomScheduler, version: tuple[int, int] | None, cpu: str, preemption: str
) -> None:
    """kube-scheduler 1.22+ appends what its preemption found to the FailedScheduling message; 1.20 and 1.21 write
    the filters' account alone. A pod of the same priority as the one running (nothing to evict), or one asking more
    than the node has (no eviction helps), reads what a pod behind kube-scheduler of the server's release reads."""
    service.mirror.server_version = version
    service.mirror.on_pods("ADDED", bound("same", "n1", cpu="1"))
    service.mirror.on_pods("ADDED", pod("big", cpu=cpu))
    run_once(service)
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    [event] = writer.events("FailedScheduling")
    assert event["message"] == "0/1 nodes are available: 1 Insufficient cpu." + preemption
