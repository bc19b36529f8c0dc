"""kube-scheduler 1.20's NodeResourcesMostAllocated table (`TestNodeResourcesMostAllocated`; in the copy read,
`TestMostAllocatedScoringStrategy`, pkg/scheduler/framework/plugins/noderesources/most_allocated_test.go), held
against kubegpu.

Read at kubernetes/kubernetes commit 030880a5dc5449403c6d1f0aa146a7dc21d6c6dc, a later copy than 1.20 where the
plugin became NodeResourcesFit's MostAllocated strategy; its rows with the default cpu and memory weights and no
extended resources are 1.20's rows. Quantities are the copy's (cpu in cores, memory in bytes); the shares are 1.20's.
Left out as not 1.20's: "no resources requested, pods scheduled, nonzero request for resource" (later releases clamp
a request above capacity to 100 where 1.20 scores 0) and the extended-resource rows of `scoringStrategy.resources`.

Scores: as for LeastAllocated (`test_noderesources_least_allocated`), with `scores.most_allocated`, `requested x 100 /
capacity` per resource averaged, and the engine under `--policy binpack`.
"""

from __future__ import annotations

import pytest

from kubegpu.scheduler import scores

from ._kube import Requests, case_id
from ._resources import Nodes, Placed, engine_choice, expected_from, most

TEST = "TestNodeResourcesMostAllocated"
UNEVEN: Nodes = [("node1", "4000", "10000"), ("node2", "6000", "10000")]
LARGE: Nodes = [("node1", "10000", "20000"), ("node2", "10000", "20000")]
TWO_CONTAINERS: Requests = [{"cpu": "1000", "memory": "2000"}, {"cpu": "2000", "memory": "3000"}]
CPU_ONLY = {"cpu": "3000", "memory": "0"}
CPU_AND_MEMORY = {"cpu": "3000", "memory": "5000"}

# (upstream case name, nodes, existing pods, the incoming pod's containers, expected score per node)
CASES: list[tuple[str, Nodes, Placed, Requests, dict[str, int]]] = [
    (
        "nothing scheduled, nothing requested",
        [("node1", "4000", "10000"), ("node2", "4000", "10000")],
        [],
        [],
        {"node1": 0, "node2": 0},
    ),
    (
        "nothing scheduled, resources requested, differently sized nodes",
        UNEVEN,
        [],
        TWO_CONTAINERS,
        {"node1": 62, "node2": 50},
    ),
    (
        "no resources requested, pods scheduled with resources",
        LARGE,
        [([CPU_ONLY], "node1"), ([CPU_ONLY], "node1"), ([CPU_ONLY], "node2"), ([CPU_AND_MEMORY], "node2")],
        [],
        {"node1": 30, "node2": 42},
    ),
    (
        "resources requested, pods scheduled with resources",
        LARGE,
        [([CPU_ONLY], "node1"), ([CPU_AND_MEMORY], "node2")],
        TWO_CONTAINERS,
        {"node1": 42, "node2": 55},
    ),
    (
        "resources requested equal node capacity",
        [("node1", "5000", "10000"), ("node2", "10000", "9000")],
        [],
        [{"cpu": "2000", "memory": "4000"}, {"cpu": "3000", "memory": "5000"}],
        {"node1": 95, "node2": 75},
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {
    "nothing scheduled, resources requested with different weight on CPU and memory, differently sized nodes": (
        "per-resource weights (NodeResourcesMostAllocatedArgs.resources): kubegpu's profile weighs cpu and memory "
        "equally and accepts no args for this plugin"
    ),
    "resource with negative weight": "validation of NodeResourcesMostAllocatedArgs.resources, which kubegpu lacks",
    "resource with zero weight": "validation of NodeResourcesMostAllocatedArgs.resources, which kubegpu lacks",
    "resource weight larger than MaxNodeScore": (
        "validation of NodeResourcesMostAllocatedArgs.resources, which kubegpu lacks"
    ),
}


@pytest.mark.parametrize(
    ("nodes", "placed", "incoming", "expected"), [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES]
)
def test_most_allocated(nodes: Nodes, placed: Placed, incoming: Requests, expected: dict[str, int]) -> None:
    assert expected_from(nodes, placed, incoming, most) == expected
    chosen = engine_choice(nodes, placed, incoming, scores.MOST_ALLOCATED, "binpack")
    if chosen is not None:
        assert expected[chosen] == max(expected.values())
