"""A Node (or a simulator file) that claims absurd device counts costs its own pods a reason, not minutes of CPU.

Plugins build per-device structures (bitmasks, ring windows, id lists); a count chosen by whoever wrote the Node
would otherwise decide how long scheduling takes and how much memory it needs.
"""

from __future__ import annotations

import importlib
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core import scheduler_hooks
from kubegpu.core.annotations import DEVICES_KEY
from kubegpu.core.kit import WholeDevicePlugin, label_devices
from kubegpu.core.limits import MAX_DEVICES_PER_NODE
from kubegpu.core.manifests import node_info
from kubegpu.core.models import DeviceCell, DeviceInfo, NodeInfo, Occupancy
from kubegpu.core.plugin_manager import PluginHookError, make_plugin_manager
from kubegpu.core.scaffold import new_plugin, tokens
from kubegpu.core.scheduler_hooks import DeviceNodeState
from kubegpu.core.testing import make_pod, node_manifest
from kubegpu.scheduler.engine import Engine

HUGE = 100_000_000
ROOT = Path(__file__).resolve().parents[2]


def neuron_inventory(highest: int) -> str:
    devices = [{"id": "0"}, {"id": str(highest)}]
    return json.dumps({"version": 1, "inventories": {"neuron": {"plugin": "neuron", "devices": devices}}})


@pytest.mark.parametrize(
    ("resource", "node_kwargs"),
    [
        ("aws.amazon.com/neuron", {"allocatable": {"aws.amazon.com/neuron": HUGE}}),
        (
            "nvidia.com/gpu",
            {"allocatable": {"nvidia.com/gpu": HUGE}, "labels": {"nvidia.com/gpu.count": str(HUGE)}},
        ),
        (
            "aws.amazon.com/neuron",
            {"allocatable": {"aws.amazon.com/neuron": 2}, "annotations": {DEVICES_KEY: neuron_inventory(99_999_999)}},
        ),
    ],
    ids=["neuron-allocatable", "nvidia-count", "neuron-advertised-id"],
)
def test_a_node_claiming_absurd_devices_is_refused_quickly(resource: str, node_kwargs: dict[str, object]) -> None:
    engine = Engine(make_plugin_manager("scheduler"))
    started = time.process_time()
    engine.add_node(node_info(node_manifest("liar", **node_kwargs)))  # type: ignore[arg-type]
    decision = engine.schedule(make_pod("victim", {"main": {resource: 1}}))
    assert time.process_time() - started < 1.0
    assert not decision.scheduled
    [problem] = engine.nodes["liar"].problems.values()
    assert f"node liar claims {HUGE} " in problem and f"at most {MAX_DEVICES_PER_NODE} devices" in problem


# -- the bound every plugin passes through, kit or not ------------------------------------------------------------
#
# A plugin author should not have to remember the bound. The engine refuses an advertised inventory over it for any
# plugin before the plugin builds anything; the kit's base refuses a device list over it whatever its source; a count
# label is judged on its text (`kubegpu.core.limits.bounded_count`), so `999999999999` builds nothing; and a picture
# of more devices than kubegpu handles is a wrong answer at the checked boundary (`kubegpu.core.answers`).

HANDMADE = "handmade.example/device"
WIDE = 10_000  # devices one inventory annotation (256 KiB) can hold


class Handmade:
    """A plugin written against the hook specifications alone, without the kit: a list per node of its devices."""

    def __init__(self) -> None:
        self.built: list[str] = []

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_resources(self) -> list[str]:
        return [HANDMADE]

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_build_node(self, node: NodeInfo) -> DeviceNodeState | None:
        inventory = node.inventories.get("handmade")
        if inventory is None:
            return None
        self.built.append(node.name)
        state = DeviceNodeState(node.name)
        state.ids = [device.id for device in inventory.devices]  # type: ignore[attr-defined]
        return state

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_describe(self, state: DeviceNodeState) -> list[Occupancy]:
        ids = state.ids  # type: ignore[attr-defined]
        return [Occupancy(family=HANDMADE, cells=[DeviceCell(id=i) for i in ids], total=len(ids), free=len(ids))]


class KitPlugin(WholeDevicePlugin):
    """The kit's defaults: devices from the advertised inventory."""

    resources = ("kit.example/device",)


class Listed(WholeDevicePlugin):
    """A kit plugin that lists its devices itself (from a label it parses its own way)."""

    resources = ("listed.example/device",)

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
        count = int(node.labels.get("listed.example/count", "0"))
        return [DeviceInfo(id=f"l{i}") for i in range(count)], None


def wide_inventory(plugin: str, count: int = WIDE) -> str:
    devices = ",".join(f'{{"id":"{i}"}}' for i in range(count))
    return f'{{"version":1,"inventories":{{"{plugin}":{{"plugin":"{plugin}","devices":[{devices}]}}}}}}'


@pytest.mark.parametrize(
    ("plugin", "resource"), [("handmade", HANDMADE), ("kit", "kit.example/device")], ids=["without-the-kit", "kit"]
)
def test_an_inventory_over_the_bound_is_refused_for_any_plugin_before_it_builds_anything(
    plugin: str, resource: str
) -> None:
    handmade = Handmade()
    manager = make_plugin_manager("scheduler", plugins=[("handmade", handmade), ("kit", KitPlugin())], autoload=False)
    engine = Engine(manager)
    node = node_info(
        node_manifest("liar", annotations={DEVICES_KEY: wide_inventory(plugin)}, allocatable={resource: WIDE})
    )
    engine.add_node(node)
    decision = engine.schedule(make_pod("victim", {"main": {resource: 1}}))
    assert not decision.scheduled
    assert f"node liar claims {WIDE} " in (decision.reason or "")
    problem = engine.nodes["liar"].problems[plugin]
    assert f"node liar claims {WIDE} " in problem and f"at most {MAX_DEVICES_PER_NODE} devices" in problem
    assert handmade.built == [], "the plugin never saw the inventory"
    assert engine.describe("liar") == [], "no picture of 10,000 devices for reports"
    # Within the bound, the same plugins build their nodes as usual.
    honest = node_manifest("honest", annotations={DEVICES_KEY: wide_inventory(plugin, 8)}, allocatable={resource: 8})
    engine.add_node(node_info(honest))
    assert plugin not in engine.nodes["honest"].problems and engine.nodes["honest"].states[plugin] is not None


def test_the_kit_refuses_a_device_list_over_the_bound_whatever_its_source() -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("listed", Listed())], autoload=False))
    engine.add_node(node_info(node_manifest("liar", labels={"listed.example/count": "2000"})))
    problem = engine.nodes["liar"].problems["listed"]
    assert "node liar claims 2000 listed devices" in problem and f"at most {MAX_DEVICES_PER_NODE}" in problem
    assert "listed" not in engine.nodes["liar"].states


def test_a_picture_of_more_devices_than_kubegpu_handles_is_a_wrong_answer() -> None:
    manager = make_plugin_manager("scheduler", plugins=[("handmade", Handmade())], autoload=False)
    state = DeviceNodeState("liar")
    state.ids = [str(i) for i in range(MAX_DEVICES_PER_NODE + 1)]  # type: ignore[attr-defined]
    with pytest.raises(PluginHookError, match=f"1025 devices; kubegpu handles at most {MAX_DEVICES_PER_NODE}"):
        manager.call("handmade", "kubegpu_scheduler_describe", state=state)
    state.ids = state.ids[:MAX_DEVICES_PER_NODE]  # type: ignore[attr-defined]
    [picture] = manager.call("handmade", "kubegpu_scheduler_describe", state=state)
    assert picture.total == MAX_DEVICES_PER_NODE


def fpga_plugin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[object, str, str]:
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "fpga"))
    module = importlib.import_module("kubegpu_fpga.scheduler")
    return module.plugin, "example.com/fpga.count", "example.com/fpga"


def scaffold_plugin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[object, str, str]:
    """The plugin `kubegpu plugins new` writes, imported from where it was written."""
    new_plugin("boundcheck", tmp_path / "boundcheck")
    monkeypatch.syspath_prepend(str(tmp_path / "boundcheck"))
    module = importlib.import_module("kubegpu_boundcheck.scheduler")
    values = tokens("boundcheck")
    return module.plugin, f"{values['RESOURCE_NAME']}.count", values["RESOURCE_NAME"]


class LabelKit(WholeDevicePlugin):
    resources = ("labelled.example/device",)

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
        return label_devices(node.labels, "labelled.example/count", "lab"), None


def kit_plugin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[object, str, str]:
    return LabelKit(), "labelled.example/count", "labelled.example/device"


@pytest.mark.parametrize("count", ["1025", "9999", "999999999999", "0000000000000000000000002048"])
@pytest.mark.parametrize("source", [kit_plugin, scaffold_plugin, fpga_plugin], ids=["kit", "scaffold", "fpga"])
def test_a_count_label_over_the_bound_is_refused_before_anything_is_built(
    source: Any, count: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plugin, label, resource = source(monkeypatch, tmp_path)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("under-test", plugin)], autoload=False))
    node = node_info(node_manifest("liar", labels={label: count}, allocatable={resource: MAX_DEVICES_PER_NODE}))
    tracemalloc.start()
    started = time.process_time()
    try:
        engine.add_node(node)
        elapsed, (_, peak) = time.process_time() - started, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5 and peak < 4 * 1024 * 1024, f"{elapsed:.2f} s, {peak / 2**20:.1f} MiB for one node"
    problem = engine.nodes["liar"].problems["under-test"]
    assert "node liar" in problem and f"at most {MAX_DEVICES_PER_NODE} devices" in problem, problem
    assert not engine.schedule(make_pod("victim", {"main": {resource: 1}})).scheduled
    # The largest count kubegpu handles still builds its devices.
    biggest = {label: str(MAX_DEVICES_PER_NODE)}
    engine.add_node(node_info(node_manifest("big", labels=biggest, allocatable={resource: MAX_DEVICES_PER_NODE})))
    assert "under-test" not in engine.nodes["big"].problems
    assert engine.schedule(make_pod("fits", {"main": {resource: MAX_DEVICES_PER_NODE}})).node == "big"
