"""kube-scheduler 1.20's NodeResourcesBalancedAllocation table (`TestNodeResourcesBalancedAllocation`,
pkg/scheduler/framework/plugins/noderesources/balanced_allocation_test.go), held against kubegpu.

Read at kubernetes/kubernetes commit 00fdb4ffc64976886691c99434ab5b01fa54f8fe, a later copy than 1.20. Its pods and
nodes are 1.20's (cpu in millicores, memory in bytes); its expected scores are not: from 1.23 the plugin scores
`(1 - standard deviation of the shares) x 100`, where 1.20 scores `(1 - |cpu share - memory share|) x 100`, and 0
once either share reaches 1. The expected scores below are 1.20's formula over the copy's rows, each share written
out. Left out as not 1.20's: the scalar-resource and DRA rows (`NodeResourcesBalancedAllocationArgs.resources`, 1.23+)
and the PreScore skip of a best-effort pod (the score is the same without it).

Scores: kubegpu exposes the rule as `scores.balanced_allocation` over `scores.nonzero_requests` sums, used as is
(no normalization, as in 1.20); the engine, scoring with BalancedAllocation alone, must pick a node the table scores
highest wherever the pod fits every node.
"""

from __future__ import annotations

import pytest

from kubegpu.scheduler import scores

from ._kube import Requests, case_id
from ._resources import Nodes, Placed, engine_choice, expected_from

TEST = "TestNodeResourcesBalancedAllocation"
CPU_ONLY: Requests = [{"cpu": "1000m", "memory": "0"}, {"cpu": "2000m", "memory": "0"}]
CPU_AND_MEMORY: Requests = [{"cpu": "1000m", "memory": "2000"}, {"cpu": "2000m", "memory": "3000"}]

# (upstream case name, nodes, existing pods, the incoming pod's containers, expected 1.20 score per node)
CASES: list[tuple[str, Nodes, Placed, Requests, dict[str, int]]] = [
    (
        # a pod without containers: both shares 0 -> 100 (the copy names it for its PreScore skip)
        "nothing scheduled, nothing requested, skip in PreScore",
        [("node1", "4", "10000"), ("node2", "4", "10000")],
        [],
        [],
        {"node1": 100, "node2": 100},
    ),
    (
        # node1: cpu 3000/4000 = 0.75, memory 5000/10000 = 0.5 -> 75; node2: 0.5, 0.5 -> 100
        "nothing scheduled, resources requested, differently sized nodes",
        [("node1", "4", "10000"), ("node2", "6", "10000")],
        [],
        CPU_AND_MEMORY,
        {"node1": 75, "node2": 100},
    ),
    (
        # node1: cpu 6000/10000 = 0.6, memory 5000/20000 = 0.25 -> 65; node2: 0.6, 10000/20000 = 0.5 -> 90
        "resources requested, pods scheduled with resources",
        [("node1", "10", "20000"), ("node2", "10", "20000")],
        [(CPU_ONLY, "node1"), (CPU_AND_MEMORY, "node2")],
        CPU_AND_MEMORY,
        {"node1": 65, "node2": 90},
    ),
    (
        # node1: 0.6, 0.25 -> 65; node2: 0.6, 10000/50000 = 0.2 -> 60
        "resources requested, pods scheduled with resources, differently sized nodes",
        [("node1", "10", "20000"), ("node2", "10", "50000")],
        [(CPU_ONLY, "node1"), (CPU_AND_MEMORY, "node2")],
        CPU_AND_MEMORY,
        {"node1": 65, "node2": 60},
    ),
    (
        # both: cpu 6000/6000 = 1 -> 0
        "requested resources at node capacity",
        [("node1", "6", "10000"), ("node2", "6", "10000")],
        [(CPU_ONLY, "node1"), (CPU_AND_MEMORY, "node2")],
        CPU_ONLY,
        {"node1": 0, "node2": 0},
    ),
]

NOT_EXPRESSIBLE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("nodes", "placed", "incoming", "expected"), [pytest.param(*c[1:], id=case_id(TEST, c[0])) for c in CASES]
)
def test_balanced_allocation(nodes: Nodes, placed: Placed, incoming: Requests, expected: dict[str, int]) -> None:
    assert expected_from(nodes, placed, incoming, scores.balanced_allocation) == expected
    chosen = engine_choice(nodes, placed, incoming, scores.BALANCED, "binpack")
    if chosen is not None:
        assert expected[chosen] == max(expected.values())
