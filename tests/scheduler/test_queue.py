"""The custom scheduler's queue, as kube-scheduler's: backoff per attempt, and unschedulable pods brought back by the
cluster events that can help them, not by any event and not in a loop.

The scheduler runs without a cluster (as in test_service_guards.py): informer events are handed to its mirror directly
and a recording writer stands in for the API server. The clock is the queue's `time.monotonic`, moved by the test.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.models import LabelSelector, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler import queue
from kubegpu.scheduler.config import parse_config
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine

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
