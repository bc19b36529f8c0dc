"""kube-scheduler 1.20's NodeResourcesLeastAllocated table (`TestNodeResourcesLeastAllocated`; in the copy read,
`TestLeastAllocatedScoringStrategy`, pkg/scheduler/framework/plugins/noderesources/least_allocated_test.go), held
against kubegpu.

Read at kubernetes/kubernetes commit 008b3652959ca58af8be3fb5b6ecfe9ae7638282, a later copy than 1.20 where the
plugin became NodeResourcesFit's LeastAllocated strategy; its rows with the default cpu and memory weights are
1.20's rows (1.20 wrote cpu in millicores, the copy in cores: the shares, hence the scores, are the same). Quantities
are the copy's: cpu "4000" is 4000 cores, memory "10000" is 10000 bytes.

Scores: upstream compares the plugin's score, (cpu score + memory score) / 2 with each `(capacity - requested) x
100 / capacity`, which NormalizeScore leaves as it is. kubegpu exposes the per-resource rule as
`scores.least_allocated` and counts requests with `scores.nonzero_requests`; the engine averages cpu and memory for
a pod without devices under `--policy spread`. The table's numbers are compared with those functions, and the
engine, scoring with NodeResourcesLeastAllocated alone, must pick a node the table scores highest wherever the pod
fits every node.
"""

from __future__ import annotations

import pytest

from kubegpu.scheduler import scores

from ._kube import Requests, case_id
from ._resources import Nodes, Placed, engine_choice, expected_from, least

TEST = "TestNodeResourcesLeastAllocated"
SMALL: Nodes = [("node1", "4000", "10000"), ("node2", "4000", "10000")]
UNEVEN: Nodes = [("node1", "4000", "10000"), ("node2", "6000", "10000")]
LARGE: Nodes = [("node1", "10000", "20000"), ("node2", "10000", "20000")]
TWO_CONTAINERS: Requests = [{"cpu": "1000", "memory": "2000"}, {"cpu": "2000", "memory": "3000"}]
CPU_ONLY = {"cpu": "3000", "memory": "0"}
CPU_AND_MEMORY = {"cpu": "3000", "memory": "5000"}

# (upstream case name, nodes, existing pods, the incoming pod's containers, expected score per node)
CASES: list[tuple[str, Nodes, Placed, Requests, dict[str, int]]] = [
    ("nothing scheduled, nothing requested", SMALL, [], [], {"node1": 100, "node2": 100}),
    (
        "nothing scheduled, resources requested, differently sized nodes",
        UNEVEN,
        [],
        TWO_CONTAINERS,
        {"node1": 37, "node2": 50},
    ),
    (
        "no resources requested, pods scheduled",
        SMALL,
        [([], "node1"), ([], "node1"), ([], "node2"), ([], "node2")],
        [],
        {"node1": 100, "node2": 100},
    ),
    (
        "no resources requested, pods scheduled with resources",
        LARGE,
        [([CPU_ONLY], "node1"), ([CPU_ONLY], "node1"), ([CPU_ONLY], "node2"), ([CPU_AND_MEMORY], "node2")],
        [],
        {"node1": 70, "node2": 57},
    ),
    (
        "resources requested, pods scheduled with resources",
        LARGE,
        [([CPU_ONLY], "node1"), ([CPU_AND_MEMORY], "node2")],
        TWO_CONTAINERS,
        {"node1": 57, "node2": 45},
    ),
    (
        "resources requested, pods scheduled with resources, differently sized nodes",
        [("node1", "10000", "20000"), ("node2", "10000", "50000")],
        [([CPU_ONLY], "node1"), ([CPU_AND_MEMORY], "node2")],
        TWO_CONTAINERS,
        {"node1": 57, "node2": 60},
    ),
    (
        "requested resources exceed node capacity",
        SMALL,
        [([CPU_ONLY], "node1"), ([CPU_AND_MEMORY], "node2")],
        [CPU_ONLY],
        {"node1": 50, "node2": 25},
    ),
    (
        "zero node resources, pods scheduled with resources",
        [("node1", "0", "0"), ("node2", "0", "0")],
        [([CPU_ONLY], "node1"), ([CPU_AND_MEMORY], "node2")],
        [],
        {"node1": 0, "node2": 0},
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {
    "nothing scheduled, resources requested with different weight on CPU and memory, differently sized nodes": (
        "per-resource weights (NodeResourcesLeastAllocatedArgs.resources): kubegpu's profile weighs cpu and memory "
        "equally and accepts no args for this plugin"
    ),
    "resource with negative weight": "validation of NodeResourcesLeastAllocatedArgs.resources, which kubegpu lacks",
    "resource with zero weight": "validation of NodeResourcesLeastAllocatedArgs.resources, which kubegpu lacks",
    "resource weight larger than MaxNodeScore": (
        "validation of NodeResourcesLeastAllocatedArgs.resources, which kubegpu lacks"
    ),
}


@pytest.mark.parametrize(
    ("nodes", "placed", "incoming", "expected"), [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES]
)
def test_least_allocated(nodes: Nodes, placed: Placed, incoming: Requests, expected: dict[str, int]) -> None:
    assert expected_from(nodes, placed, incoming, least) == expected
    chosen = engine_choice(nodes, placed, incoming, scores.LEAST_ALLOCATED, "spread")
    if chosen is not None:
        assert expected[chosen] == max(expected.values())
