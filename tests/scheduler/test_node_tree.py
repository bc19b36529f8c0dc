"""The order kube-scheduler 1.20 reads nodes in (its node tree): zone by zone in turn, zones in the order they first
appeared, nodes in the order they joined their zone (`kubegpu.scheduler.index.NodeTree`)."""

from __future__ import annotations

import pytest

from kubegpu.scheduler.index import NodeTree, zone_key

ZONE = "topology.kubernetes.io/zone"


def tree(*nodes: tuple[str, str]) -> NodeTree:
    t = NodeTree()
    for name, zone in nodes:
        t.set(name, zone)
    return t


def test_nodes_added_zone_by_zone_are_listed_zone_by_zone_in_turn() -> None:
    t = tree(("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c"), ("c2", "c"))
    assert t.order() == ["a1", "b1", "c1", "a2", "c2", "a3"]


def test_a_node_that_moves_zone_joins_its_new_zone_last_and_an_emptied_zone_goes() -> None:
    t = tree(("a1", "a"), ("b1", "b"), ("b2", "b"), ("c1", "c"))
    t.set("a1", "b")  # zone a empties: b and c remain, in the order they appeared
    assert t.order() == ["b1", "c1", "b2", "a1"]
    t.discard("c1")
    t.set("b1", "b")  # unchanged zone: keeps its place
    assert t.order() == ["b1", "b2", "a1"]
    assert len(t) == 3


@pytest.mark.parametrize(
    ("labels", "key"),
    [
        ({}, ""),
        ({ZONE: "z1"}, ":\x00:z1"),
        ({"topology.kubernetes.io/region": "r", ZONE: "z1"}, "r:\x00:z1"),
        ({"failure-domain.beta.kubernetes.io/zone": "old", ZONE: "new"}, ":\x00:old"),
    ],
    ids=["none", "zone", "region-and-zone", "beta-label-first"],
)
def test_the_zone_key_reads_region_and_zone_as_kube_scheduler_does(labels: dict[str, str], key: str) -> None:
    assert zone_key(labels) == key
