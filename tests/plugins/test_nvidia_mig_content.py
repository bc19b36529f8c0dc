"""A MIG node's scoring content (`NvidiaNodeState.scoring_content`): what the engine's local scores and its shared
filter answers read of the node, by value. The MIG books were in it by identity: each MIG node's content was its
own even where another node had the same GPUs, layout and devices held (no answer shared between them), and a node's
content stayed equal to itself while the devices held changed under it, so that only the rest of the content (the
node's usage, the capacity it offers) kept answers remembered by it from going stale."""

from __future__ import annotations

import random

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices, NodeInfo, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import mig
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

SMALL, WIDE = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
LAYOUT = "1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,3g.40gb@4"


def mig_node(name: str) -> NodeInfo:
    """An A100 80GB laid out as four 1g.10gb and one 3g.40gb, as `kubegpu advertise` describes it."""
    gpu = DeviceInfo(
        id="0", model="NVIDIA A100-SXM4-80GB", memory=81920 << 20, attributes={mig.LAYOUT_ATTRIBUTE: LAYOUT}
    )
    devices = encode_devices(NodeDevices(inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=[gpu])}))
    return make_node(name, annotations={DEVICES_KEY: devices}, allocatable={SMALL: 4, WIDE: 1})


def small(name: str) -> PodRequest:
    return make_pod(name, {"main": {SMALL: 1}})


def content(engine: Engine, name: str) -> object:
    return engine.scoring_content(engine.nodes[name])


def test_mig_nodes_alike_share_their_content_and_a_change_of_the_devices_held_changes_it() -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for name in ("a100-0", "a100-1"):
        engine.add_node(mig_node(name))
    assert content(engine, "a100-0") == content(engine, "a100-1"), "two MIG nodes alike are scored apart"

    first = engine.reserve(small("a"), "a100-0")
    assert first.allocation is not None and first.allocation.containers == {"main": {SMALL: ["0@0"]}}
    holding_slice_0 = content(engine, "a100-0")
    assert holding_slice_0 != content(engine, "a100-1")
    assert engine.reserve(small("b"), "a100-1").scheduled  # the same device, held by another pod
    assert content(engine, "a100-0") == content(engine, "a100-1")

    second = engine.reserve(small("c"), "a100-0")
    assert second.allocation is not None and second.allocation.containers == {"main": {SMALL: ["0@1"]}}
    engine.release("default/a")  # a100-0 holds one 1g.10gb, as before, but at slice 1
    assert content(engine, "a100-0") != holding_slice_0, "the devices held changed, the content did not"
    assert content(engine, "a100-0") != content(engine, "a100-1")


def test_mig_pods_are_decided_as_by_an_engine_that_scores_every_node_alone() -> None:
    """The oracle: an engine that shares no answer between nodes (every node's content its own). Pods of both
    profiles come and go on four MIG nodes alike; every decision, its node, devices and reason, is the oracle's."""
    engines = [Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)) for _ in "ab"]
    engines[1].scoring_content = lambda record: None  # type: ignore[method-assign]
    for engine in engines:
        for i in range(4):
            engine.add_node(mig_node(f"a100-{i}"))
    rng = random.Random(7)
    placed: list[str] = []
    for step in range(80):
        if placed and rng.random() < 0.35:
            key = placed.pop(rng.randrange(len(placed)))
            for engine in engines:
                engine.release(key)
            continue
        pod = make_pod(f"p{step}", {"main": {rng.choice((SMALL, SMALL, WIDE)): 1}})
        shared, alone = (engine.schedule(pod) for engine in engines)
        assert (shared.node, shared.reason) == (alone.node, alone.reason), step
        assert (shared.allocation and shared.allocation.containers) == (
            alone.allocation and alone.allocation.containers
        )
        if shared.scheduled:
            placed.append(pod.key)
