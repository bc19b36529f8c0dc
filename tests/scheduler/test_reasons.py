"""Refusal reasons a user reads in `0/N nodes are available: ...`: each node counted under the reason that really
stops it, in kube-scheduler's filter order, and the device rule named when free devices exist but no valid set."""

from __future__ import annotations

from kubegpu.core.manifests import pod_request
from kubegpu.core.models import PodRequest
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


def test_a_class_is_not_counted_under_one_nodes_reasons_when_its_other_nodes_also_lack_what_is_in_use() -> None:
    """Two nodes alike in all but name, 4 cpus each, one with its memory taken: a pod asking for 8 cpus can never
    fit either, but kube-scheduler counts each node under every resource it lacks (NodeResourcesFit), so the full
    node is counted under memory too."""
    e = engine()
    for name in ("n1", "n2"):
        e.add_node(make_node(name, cpu="4", memory="8Gi"))
    assert e.reserve(make_pod("hog", {"main": {"cpu": "100m", "memory": "8Gi"}}), "n2").scheduled
    decision = e.schedule(make_pod("big", {"main": {"cpu": "8", "memory": "1Gi"}}))
    assert decision.reason == "0/2 nodes are available: 1 Insufficient memory, 2 Insufficient cpu."


def test_a_device_refusal_does_not_stand_for_a_node_of_its_class_that_a_filter_before_it_refuses() -> None:
    """No trn1 ever gives a container 7 Neuron devices (the plugin's own rule); a trn1 with its cpus taken is stopped
    earlier, by NodeResourcesFit, and says so: kube-scheduler runs the filters in order and reports the first that
    refuses each node."""
    e = engine()
    for name in ("trn1-a", "trn1-b"):
        e.add_node(make_node(name, labels=TRN1, cpu="4", allocatable={DEVICE: 16}))
    assert e.reserve(make_pod("hog", {"main": {"cpu": "4"}}), "trn1-b").scheduled
    decision = e.schedule(make_pod("seven", {"main": {DEVICE: 7, "cpu": "1"}}))
    assert not decision.scheduled
    assert decision.reason == (
        "0/2 nodes are available: 1 Instance type trn1.32xlarge does not support requests for device: 7. Please "
        "request a different number of devices., 1 Insufficient cpu."
    )


def test_a_remembered_class_count_equals_a_fresh_one_after_pods_come_and_go() -> None:
    """The count of a class settled by a hopeless size is remembered per pod shape and kept current from the nodes
    that changed (`Engine._tally`); after each placement and release it equals a fresh engine's count."""
    import random

    chance = random.Random(21)
    names = [f"n{i}" for i in range(8)]

    def cluster() -> Engine:
        e = engine()
        for name in names:
            e.add_node(make_node(name, cpu="4", memory="8Gi", allocatable={"pods": "3"}))
        return e

    live, placed = cluster(), {}
    big = make_pod("big", {"main": {"cpu": "8", "memory": "1Gi"}})
    for step in range(40):
        if placed and chance.random() < 0.4:
            key = chance.choice(sorted(placed))
            assert live.release(key) is not None
            del placed[key]
        else:
            hog = make_pod(f"hog-{step}", {"main": {"cpu": "100m", "memory": f"{chance.choice([1, 4, 8])}Gi"}})
            node = chance.choice(names)
            if live.reserve(hog, node).scheduled:
                placed[hog.key] = (hog, node)
        fresh = cluster()
        for hog, node in placed.values():
            assert fresh.reserve(hog, node).scheduled
        assert live.schedule(big).reason == fresh.schedule(big).reason, step


def test_the_reasons_of_a_pod_that_fits_nowhere_follow_the_nodes_as_they_change() -> None:
    """The nodes the cpu index passes over are explained from remembered answers, brought up to date with the
    nodes changed since (`_skipped_tally`): a node that took a pod holding the port since is counted under it."""

    def pod(name: str, cpu: str, port: int = 0) -> PodRequest:
        container: dict[str, object] = {"name": "c", "resources": {"requests": {"cpu": cpu}}}
        if port:
            container["ports"] = [{"containerPort": port, "hostPort": port}]
        return pod_request({"kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                            "spec": {"containers": [container]}})[0]  # fmt: skip

    e = engine()
    for name in ("n0", "n1", "n2"):
        e.add_node(make_node(name, cpu="4"))
        assert e.reserve(pod(f"fill-{name}", "3500m"), name).scheduled
    big = pod("big", "3", port=80)
    first = e.schedule(big)
    assert first.reason == "0/3 nodes are available: 3 Insufficient cpu."
    assert e.reserve(pod("web", "100m", port=80), "n1").scheduled
    again = e.schedule(big)
    assert again.reason == (
        "0/3 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 2 Insufficient cpu."
    )
