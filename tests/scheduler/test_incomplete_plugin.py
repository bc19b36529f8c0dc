"""A plugin that builds node states but lacks a hook the engine places pods with (fit, allocate or take) costs only
its own pods: each is refused with an error naming the plugin and the missing hook, and the engine keeps serving
(it raised AttributeError from deep in the filter phase before)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.models import NodeInfo, PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom, hookimpl
from kubegpu.core.status import Status
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine

WIDGET = "example.com/widget"


class Widgets:
    @hookimpl
    def kubegpu_scheduler_resources(self) -> list[str]:
        return [WIDGET]

    @hookimpl
    def kubegpu_scheduler_build_node(self, node: NodeInfo) -> DeviceNodeState:
        return DeviceNodeState(node.name)


class Fits(Widgets):
    @hookimpl
    def kubegpu_scheduler_headroom(self, state: DeviceNodeState) -> Headroom:
        return Headroom({WIDGET: 2})

    @hookimpl
    def kubegpu_scheduler_fit(self, state: DeviceNodeState, pod: PodRequest) -> Status:
        return Status.success()


class Allocates(Fits):
    @hookimpl
    def kubegpu_scheduler_allocate(self, state: DeviceNodeState, pod: PodRequest) -> PluginAllocation:
        return PluginAllocation(plugin="widgets", containers={})


@pytest.mark.parametrize(
    ("plugin", "missing"),
    [
        (Widgets(), "kubegpu_scheduler_fit"),
        (Fits(), "kubegpu_scheduler_allocate"),
        (Allocates(), "kubegpu_scheduler_take"),
    ],
    ids=["no fit", "no allocate", "no take"],
)
def test_a_plugin_missing_a_placing_hook_refuses_its_pods_naming_the_hook(plugin: Any, missing: str) -> None:
    e = Engine(make_plugin_manager("scheduler", plugins=[("widgets", plugin)], autoload=False))
    e.add_node(make_node("n", allocatable={WIDGET: 2}))
    decision = e.schedule(make_pod("p", {"main": {WIDGET: 1}}))
    assert not decision.scheduled
    assert f"plugin 'widgets' failed in {missing}: NotImplementedError" in (decision.reason or "")
    assert e.schedule(make_pod("plain", {"main": {"cpu": "1"}})).node == "n"
