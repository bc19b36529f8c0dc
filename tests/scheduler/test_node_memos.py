"""What a node remembers between cycles: the answers for each pod shape it was asked about, so that the replicas of
many Deployments arriving interleaved cost a plugin call only where a node changed. (Device pods' shapes include their
labels, because a plugin may read them, so every Deployment's replicas are a shape of their own.)"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from kubegpu.core.plugin_manager import KubegpuPluginManager, make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import CHECKS_REMEMBERED, Engine
from kubegpu.scheduler.engine.records import make_room

from . import toy_plugin as toy

NODES = 40


def counting_engine(monkeypatch: pytest.MonkeyPatch) -> tuple[Engine, Counter[str]]:
    calls: Counter[str] = Counter()
    original = KubegpuPluginManager._impl

    def impl(self: KubegpuPluginManager, plugin: str, hook: str) -> tuple[Any, tuple[str, ...]] | None:
        """The plugin's implementation, counting its calls (through `call` and `bound` alike)."""
        found = original(self, plugin, hook)
        if found is None:
            return None
        function, argnames = found

        def counted(*args: Any) -> Any:
            calls[hook] += 1
            return function(*args)

        return counted, argnames

    monkeypatch.setattr(KubegpuPluginManager, "_impl", impl)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False))
    for i in range(NODES):
        engine.add_node(make_node(f"n{i:02d}", labels={"toy.example/cards": "64"}, allocatable={toy.RESOURCE: 64}))
    return engine, calls


@pytest.mark.parametrize("shapes", [2, 13, 32])  # 32 shapes fill no node in two rounds
def test_interleaved_deployments_are_judged_once_per_node_and_shape(
    monkeypatch: pytest.MonkeyPatch, shapes: int
) -> None:
    engine, calls = counting_engine(monkeypatch)

    def one_round(round_: int) -> None:
        for app in range(shapes):
            pod = replace(make_pod(f"r{round_}-{app}", {"main": {toy.RESOURCE: 1}}), labels={"app": f"app-{app}"})
            assert engine.schedule(pod).scheduled

    one_round(0)
    calls.clear()
    one_round(1)
    # The second round: binpacking, every pod lands on the node the pod before it changed, which alone answers anew;
    # every other node it asks answers its shape from memory: one fit and one score a pod (the engine asks several
    # nodes a pod; a node that forgot the shape would be asked again).
    assert calls["kubegpu_scheduler_fit"] == shapes
    assert calls["kubegpu_scheduler_score"] == shapes


def test_a_node_remembers_its_last_checks_remembered_shapes() -> None:
    # A trace of a GPU cluster has a few hundred shapes (the openb trace 151): a node keeps the answers of the last
    # CHECKS_REMEMBERED shapes asked, the one asked longest ago going first.
    assert CHECKS_REMEMBERED >= 151
    memo: dict[int, int] = {}
    for slot in range(CHECKS_REMEMBERED + 1):
        make_room(memo, slot)
        memo[slot] = slot
        make_room(memo, 0)  # shape 0 asked again each time: it stays
        memo[0] = 0
    assert len(memo) == CHECKS_REMEMBERED
    assert 0 in memo and 1 not in memo and CHECKS_REMEMBERED in memo


def test_a_cycle_filters_only_the_nodes_changed_since_its_shape_last_passed_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The nodes a shape's last cycles found passing (`Passing`, kept from the change log) fit its next pod without
    being filtered again: binpacking replicas, each cycle filters the one node the replica before it changed, not
    the policy's first few again (that was 8 `check`s a pod on every workload without cluster-wide rules)."""
    engine, _ = counting_engine(monkeypatch)
    checked: list[str] = []
    original = Engine.check

    def check(self: Engine, record: Any, *args: Any, **kwargs: Any) -> Any:
        checked.append(record.name)
        return original(self, record, *args, **kwargs)

    monkeypatch.setattr(Engine, "check", check)
    placed = [engine.schedule(make_pod(f"warm-{i}", {"main": {toy.RESOURCE: 1}})) for i in range(3)]
    assert all(decision.scheduled for decision in placed)
    for i in range(10):
        checked.clear()
        decision = engine.schedule(make_pod(f"p{i}", {"main": {toy.RESOURCE: 1}}))
        assert decision.scheduled and decision.node == placed[0].node  # binpacking: the same node each time
        assert checked == [decision.node], f"pod {i} filtered {checked}"


def test_nodes_gone_leave_no_record_in_the_memos() -> None:
    """A cluster autoscaler replaces nodes under new names all day: 150 nodes live, 600 removed one at a time and
    replaced by a new one, a pod scheduled after each change (sampled cycles, scored nodes alike). The memos keyed by
    node name keep nothing of the nodes gone, their records above all (labels, images, plugins' books). Before, each
    removed node's record stayed in the content memos: 750 records kept for 150 nodes."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False))
    live = [f"n-{i}" for i in range(150)]
    for name in live:
        engine.add_node(make_node(name, cpu="64", labels={"kubernetes.io/hostname": name}))
    for i in range(600):
        engine.remove_node(live.pop(0))
        live.append(f"m-{i}")
        engine.add_node(make_node(live[-1], cpu="64", labels={"kubernetes.io/hostname": live[-1]}))
        assert engine.schedule(make_pod(f"p{i}", {"main": {"cpu": "10m"}})).scheduled
    kept = {id(record) for memo in (engine._contents, engine._numbering.by_node) for record, *_ in memo.values()}
    assert len(kept) <= len(live), f"{len(kept)} records kept for {len(live)} nodes"
