"""Refusal reasons a user reads in `0/N nodes are available: ...`: each node counted under the reason that really
stops it, in kube-scheduler's filter order, and the device rule named when free devices exist but no valid set."""

from __future__ import annotations

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine

NEURON = "aws.amazon.com/neuron"
DEVICE = "aws.amazon.com/neurondevice"
INF2 = {"node.kubernetes.io/instance-type": "inf2.48xlarge"}
TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}


def engine() -> Engine:
    return Engine(make_plugin_manager("scheduler"))


def test_a_fragmented_ring_names_contiguity_not_insufficient() -> None:
    e = engine()
    e.add_node(make_node("inf2-0", labels={**INF2, "zone": "a"}, allocatable={NEURON: 12}))
    fragment(e, "inf2-0", "a")
    decision = e.schedule(make_pod("three", {"main": {NEURON: 3}}))
    assert not decision.scheduled
    assert decision.reason == "0/1 nodes are available: 1 no free contiguous set of 3 Neuron devices."


def test_full_nodes_are_counted_under_the_first_filter_in_kube_schedulers_order() -> None:
    """NodeAffinity runs before NodeResourcesFit in kube-scheduler 1.20's default profile."""
    e = engine()
    for name, zone in (("trn-a1", "a"), ("trn-a2", "a"), ("trn-b1", "b")):
        e.add_node(make_node(name, labels={**TRN1, "zone": zone}, allocatable={DEVICE: 16}))
        assert e.schedule(make_pod(f"fill-{name}", {"main": {DEVICE: 16}}, node_selector={"zone": zone})).scheduled
    decision = e.schedule(make_pod("late", {"main": {DEVICE: 1}}, node_selector={"zone": "a"}))
    assert not decision.scheduled
    assert decision.reason == (
        "0/3 nodes are available: 1 node(s) didn't match node selector, 2 Insufficient aws.amazon.com/neurondevice."
    )


def test_fragmented_rings_skipped_by_the_index_give_their_own_reasons() -> None:
    e = engine()
    for name, zone in (("inf2-a", "a"), ("inf2-b", "b")):
        e.add_node(make_node(name, labels={**INF2, "zone": zone}, allocatable={NEURON: 12}))
        fragment(e, name, zone)
    decision = e.schedule(make_pod("three", {"main": {NEURON: 3}}, node_selector={"zone": "a"}))
    assert not decision.scheduled
    assert decision.reason == (
        "0/2 nodes are available: 1 no free contiguous set of 3 Neuron devices, 1 node(s) didn't match node selector."
    )


def fragment(e: Engine, node: str, zone: str) -> None:
    """Fill the node's 12-device ring with pairs, then free every other pair: 6 devices free, the longest run 2."""
    for i in range(6):
        pod = make_pod(f"{node}-pair-{i}", {"main": {NEURON: 2}}, node_selector={"zone": zone})
        assert e.schedule(pod).node == node
    for i in (0, 2, 4):
        assert e.release(f"default/{node}-pair-{i}") is not None
