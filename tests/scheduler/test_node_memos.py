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

from . import toy_plugin as toy

NODES = 40


def counting_engine(monkeypatch: pytest.MonkeyPatch) -> tuple[Engine, Counter[str]]:
    calls: Counter[str] = Counter()
    original = KubegpuPluginManager.call

    def call(self: KubegpuPluginManager, plugin: str, hook: str, **kwargs: Any) -> Any:
        calls[hook] += 1
        return original(self, plugin, hook, **kwargs)

    monkeypatch.setattr(KubegpuPluginManager, "call", call)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False))
    for i in range(NODES):
        engine.add_node(make_node(f"n{i:02d}", labels={"toy.example/cards": "64"}, allocatable={toy.RESOURCE: 64}))
    return engine, calls


@pytest.mark.parametrize("shapes", [2, 13, CHECKS_REMEMBERED])
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
