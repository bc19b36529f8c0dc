"""A node known from GPU Feature Discovery's labels alone (no `kubegpu advertise`) whose MIG counts change while pods
hold MIG devices. Its books are laid out from the counts (`mig.layout_from_counts`), so a device's id there
(`1@4`) is nominal: the kubelet picks which device of the profile a container gets. When one device went
unhealthy (the device plugin listing one 1g.10gb fewer), the layout was made anew and a running 3g.40gb pod's
nominal id named a 1g.10gb: the pod "no longer fit its devices", and every GPU of the node, whole ones too, was
given to no other pod until it left, with a reason blaming devices the node still had. A nominal id now holds a
device of its profile on the new layout, as long as the node lists enough of them."""

from __future__ import annotations

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

WIDE, SMALL, GPU = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu"
LABELS = {
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/gpu.count": "3",  # one whole GPU, two MIG-enabled
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
}


def engine_with(**allocatable: int) -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    engine.add_node(make_node("a100", labels=LABELS, allocatable={GPU: 1, WIDE: 2, **allocatable}))
    return engine


def held(engine: Engine) -> int:
    state = engine.nodes["a100"].states["nvidia"]
    return len(state.mig.holders)


def test_a_mig_device_gone_from_the_counts_leaves_the_pods_holding_theirs_and_the_rest_schedulable() -> None:
    engine = engine_with(**{SMALL: 7})
    for name, ask in (("wide-0", WIDE), ("wide-1", WIDE), ("small-0", SMALL)):
        assert engine.schedule(make_pod(name, {"main": {ask: 1}})).scheduled
    engine.add_node(make_node("a100", labels=LABELS, allocatable={GPU: 1, WIDE: 2, SMALL: 6}))  # one 1g.10gb gone
    assert engine.nodes["a100"].unheld == {}
    assert held(engine) == 3
    for name, ask in (("small-1", SMALL), ("whole", GPU)):
        decision = engine.schedule(make_pod(name, {"main": {ask: 1}}))
        assert decision.scheduled, decision.reason
    refused = engine.schedule(make_pod("wide-2", {"main": {WIDE: 1}}))
    assert refused.reason == f"0/1 nodes are available: 1 Insufficient {WIDE}."
    for name in ("wide-0", "small-0"):  # what a pod held is given back whole
        engine.release(f"default/{name}")
    assert held(engine) == 2
    assert engine.schedule(make_pod("wide-3", {"main": {WIDE: 1}})).scheduled


def test_a_node_listing_fewer_devices_than_its_pods_hold_still_gives_them_to_no_one() -> None:
    engine = engine_with(**{SMALL: 1})
    for name in ("wide-0", "wide-1"):
        assert engine.schedule(make_pod(name, {"main": {WIDE: 1}})).scheduled
    engine.add_node(make_node("a100", labels=LABELS, allocatable={GPU: 1, WIDE: 1, SMALL: 1}))  # a 3g.40gb gone
    assert list(engine.nodes["a100"].unheld) == ["default/wide-1"]
    decision = engine.schedule(make_pod("small", {"main": {SMALL: 1}}))
    assert not decision.scheduled
