"""A scheduler runs for months while tenants make up names without end: Nodes relabelled by their agents (GFD's
timestamp label changes every minute), autoscaled nodes that never come back, pods asking extended resources of
ever new names, priorities. What the engine keeps of each must go with the last thing that needed it, so that its
memory follows the cluster as it is, not everything it ever was."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from kubegpu.core.plugin_manager import OWNERS_REMEMBERED, make_plugin_manager
from kubegpu.core.testing import make_node, make_pod, node_manifest, pod_manifest
from kubegpu.scheduler.binder import REPORTS_WAITING
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.engine.plan import ROUTES_REMEMBERED

from .test_service_guards import KEY, RecordingWriter

CHURN = 20_000
ZONE = "topology.kubernetes.io/zone"


def engine_with_nodes(count: int = 4) -> Engine:
    engine = Engine(make_plugin_manager("scheduler"))
    for i in range(count):
        engine.add_node(make_node(f"n{i}", labels={ZONE: "a"}))
    return engine


def test_nodes_relabelled_and_replaced_without_end_keep_only_the_node_classes_in_use() -> None:
    engine = engine_with_nodes()
    for i in range(CHURN):
        # GFD relabels a node with the time of its last run; an autoscaler's node comes with a label of its own, is
        # judged dead once, then goes for good.
        engine.add_node(make_node("n0", labels={ZONE: "a", "nvidia.com/gfd.timestamp": str(i)}))
        engine.add_node(make_node(f"auto-{i}", labels={ZONE: "a", "pool-id": str(i)}))
        engine.set_node_live(f"auto-{i}", False)
        engine.remove_node(f"auto-{i}")
    # n0 in a class of its own, n1..n3 in another: two classes, as many as a fresh engine told the same nodes.
    assert len(engine._classes) == len(engine._class_nodes) == 2
    # The classes still tell the nodes apart: a pod selecting n0's last label goes there, one selecting a label of
    # an earlier run goes nowhere.
    latest = replace(make_pod("latest", {"main": {"cpu": "100m"}}), node_selector={"nvidia.com/gfd.timestamp": "19999"})
    assert engine.schedule(latest).node == "n0"
    stale = replace(make_pod("stale", {"main": {"cpu": "100m"}}), node_selector={"nvidia.com/gfd.timestamp": "7"})
    assert not engine.schedule(stale).scheduled


def test_pods_asking_extended_resources_of_ever_new_names_leave_a_bounded_memo() -> None:
    engine = engine_with_nodes()
    for i in range(CHURN):
        pod = make_pod(f"p{i}", {"main": {"cpu": "10m", f"example.com/made-up-{i}": 1}})
        decision = engine.schedule(pod)
        assert not decision.scheduled  # no node lists it
    assert len(engine._routes) <= ROUTES_REMEMBERED
    assert len(engine.plugins._owner_cache) <= OWNERS_REMEMBERED
    # Routes made afresh after the memos were dropped send a GPU pod to its plugin as before.
    gpu = make_pod("gpu", {"main": {"nvidia.com/gpu": 1}})
    assert engine._route(gpu) == {"nvidia": ["nvidia.com/gpu"]}


def test_pods_of_ever_new_priorities_placed_and_gone_leave_no_priority_behind() -> None:
    engine = engine_with_nodes()
    for i in range(CHURN):
        pod = replace(make_pod(f"p{i}", {"main": {"cpu": "10m"}}), priority=i)
        assert engine.schedule(pod).scheduled
        engine.release(pod.key)
    assert not engine._priorities


class SlowWriter(RecordingWriter):
    """An API server behind the client's rate limit: what is submitted waits its turn here until `drain`."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[Coroutine[Any, Any, Any]] = []

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.waiting.append(coroutine)

    def drain(self) -> None:
        waiting, self.waiting = self.waiting, []
        for coroutine in waiting:
            asyncio.run(coroutine)


def test_pods_refused_faster_than_reports_are_written_queue_a_bounded_number_of_reports() -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
    writer = SlowWriter()
    service = CustomScheduler(None, writer, engine, name="kubegpu")  # type: ignore[arg-type]
    service.mirror.on_nodes("SYNC", [node_manifest("n1", cpu="8")])
    service.mirror.on_pods("SYNC", [])
    for i in range(CHURN // 4):  # each asks 100 cores: it fits nowhere, and is refused
        service.mirror.on_pods("ADDED", pod_manifest(f"big-{i}", {"main": {"cpu": 100}}, scheduler_name="kubegpu"))
        service.schedule_active(100)
    assert len(writer.waiting) == REPORTS_WAITING
    # A pod that fits is bound as before: its Binding is not among what was left out.
    service.mirror.on_pods("ADDED", pod_manifest("small", {"main": {"cpu": 1}}, scheduler_name="kubegpu"))
    service.schedule_active(100)
    writer.drain()
    assert writer.bindings() == ["small"]
    assert len(writer.events("FailedScheduling")) == REPORTS_WAITING
    # A pod left untold is told at its next refusal, once the reports before it are written.
    untold = service.queue.unschedulable[f"default/big-{CHURN // 4 - 1}"]
    assert untold.message is None
    service.queue.unschedulable.pop(untold.key)
    service.queue.active[untold.key] = untold
    service.schedule_active(100)
    writer.drain()
    assert writer.events("FailedScheduling")[-1]["involvedObject"]["name"] == untold.request.name
