"""kube-scheduler 1.20's DefaultPreemption tables (`TestPostFilter`, `TestDryRunPreemption`, `TestSelectBestCandidate`,
pkg/scheduler/framework/plugins/defaultpreemption/default_preemption_test.go), held against kubegpu's engine.

Read in a copy of 1.20's scheduler (`dryRunPreemption(ctx, fh, state, pod, nodeInfos, pdbs, offset, numCandidates)`,
`SelectCandidate`): github.com/Mr-Linus/Mandalorian at a68905bea7be30dbb1ea041ea13311f36d6c740a. Resources as
upstream's: small 100m/100 bytes, medium 200m/200, large 300m/300, very large 500m/500; a node holds very large and
32 pods (1.20's `MakeNode().Capacity` adds `pods: 32`), TestPostFilter's nodes one pod and nothing else.

kubegpu's dry run of one node is `Engine.select_victims` (the fewest pods of lower priority to evict, most important
reprieved first, budgets' violations counted) and the choice among candidates `preemption.pick`; `Engine.preempt`
is the whole PostFilter. Upstream's fake filter plugins are `NodeFilter` objects an `Engine` takes. Upstream's start
times differ by nanoseconds (`time.Unix(0, n)`), which a pod's `status.startTime` (RFC 3339, seconds) cannot hold:
here they differ by seconds, in the same order.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import LabelSelector, PodRequest, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.status import Status
from kubegpu.scheduler.engine import Engine, Plan
from kubegpu.scheduler.preemption import Budget, pick

from ._kube import case_id, node

POST_FILTER, DRY_RUN, BEST = "TestPostFilter", "TestDryRunPreemption", "TestSelectBestCandidate"
NEG, LOW, MID, HIGH, VERY_HIGH = -100, 0, 100, 1000, 10000
SMALL, MEDIUM, LARGE, VERY_LARGE = ("100m", "100"), ("200m", "200"), ("300m", "300"), ("500m", "500")
NONE = ("0", "0")


def p(
    name: str,
    where: str | None = None,
    priority: int = 0,
    res: tuple[str, str] = NONE,
    *,
    labels: dict[str, str] | None = None,
    start: int | None = None,
    spec: dict[str, Any] | None = None,
) -> PodRequest:
    """A pod as upstream's `st.MakePod()` builds it: name and UID alike, a priority, one container's requests."""
    document: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels or {}},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": res[0], "memory": res[1]}}}],
            **(spec or {}),
        },
    }
    if where is not None:
        document["spec"]["nodeName"] = where
    if start is not None:
        document["status"] = {"startTime": f"1970-01-01T00:00:{start:02d}Z"}
    return pod_request(document)[0]


class Fake:
    """Upstream's fake filter plugins: FalseFilter (every node Unschedulable), TrueFilter (every node fits),
    MatchFilter (the node named like the pod fits) and FakeFilter returning Unschedulable."""

    reads_usage = False

    def __init__(self, name: str) -> None:
        self.name = name

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: Any, record: Any, pod: PodRequest, plan: Plan) -> Status | None:
        if self.name == "TrueFilter" or (self.name == "MatchFilter" and record.info.name == pod.name):
            return None
        return Status.unschedulable(f"refused by {self.name}")


def cluster(
    nodes: list[str], pods: list[PodRequest], *, pods_per_node: str = "32", cpu: str = "500m", memory: str = "500",
    filters: tuple[Fake, ...] = (), taints: dict[str, list[dict[str, str]]] | None = None,
) -> Engine:  # fmt: skip
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), filters=filters)
    for name in nodes:
        host, *rest = name.split("/")
        labels = dict(zip(("hostname", "zone", "region"), [host, *rest], strict=False))
        manifest = node(host, labels=labels, cpu=cpu, memory=memory, allocatable={"pods": pods_per_node},
                        taints=(taints or {}).get(host, ()))  # fmt: skip
        e.add_node(node_info(manifest))
    for placed in pods:
        assert placed.node_name is not None
        status = e.admit_bound(placed, placed.node_name, None)
        assert status.ok, status
    return e


# -- TestPostFilter -----------------------------------------------------------------------------------------------

NO_TOLERATION = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
# (upstream case name, the pod, the existing pods, the nodes, nodes made unresolvable for the pod, the node nominated)
PostFilterRow = tuple[str, PodRequest, list[PodRequest], list[str], list[str], str | None]
POST_FILTER_CASES: list[PostFilterRow] = [
    ("pod with higher priority can be made schedulable", p("p", priority=HIGH), [p("p1", "node1")], ["node1"], [],
     "node1"),
    ("pod with tied priority is still unschedulable", p("p"), [p("p1", "node1")], ["node1"], [], None),
    # upstream hands the plugin node1's status UnschedulableAndUnresolvable; here a taint the pod does not tolerate
    ("preemption should respect filteredNodesStatuses", p("p", priority=HIGH), [p("p1", "node1")], ["node1"],
     ["node1"], None),
    ("pod can be made schedulable on one node", p("p", priority=MID),
     [p("p1", "node1", HIGH), p("p2", "node2", LOW)], ["node1", "node2"], [], "node2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("incoming", "placed", "nodes", "unresolvable", "nominated"),
    [pytest.param(*c[1:], id=case_id(POST_FILTER, c[0])) for c in POST_FILTER_CASES],
)
def test_post_filter(
    incoming: PodRequest, placed: list[PodRequest], nodes: list[str], unresolvable: list[str], nominated: str | None
) -> None:
    e = cluster(nodes, placed, pods_per_node="1", cpu="0", memory="0",
                taints={name: NO_TOLERATION for name in unresolvable})  # fmt: skip
    assert not e.decide(incoming).scheduled
    assert e.preempt(incoming).node == nominated


# -- TestDryRunPreemption -------------------------------------------------------------------------------------------

FOO_PDB = Budget("default", "pdb", LabelSelector((Requirement("app", "In", ("foo",)),)), 1)
APP_FOO = {"app": "foo"}
# (upstream case name, fake filters, nodes, the pod, the existing pods, budgets,
#  expected candidates: node -> (its victims' names, sorted; budget violations))
DryRunRow = tuple[
    str, tuple[Fake, ...], list[str], PodRequest, list[PodRequest], list[Budget], dict[str, tuple[list[str], int]]
]
TWO = ["node1", "node2"]
DRY_RUN_CASES: list[DryRunRow] = [
    ("a pod that does not fit on any node", (Fake("FalseFilter"),), TWO, p("p", priority=HIGH),
     [p("p1", "node1", MID), p("p2", "node2", MID)], [], {}),
    ("a pod that fits with no preemption", (Fake("TrueFilter"),), TWO, p("p", priority=HIGH),
     [p("p1", "node1", MID), p("p2", "node2", MID)], [], {"node1": ([], 0), "node2": ([], 0)}),
    ("a pod that fits on one node with no preemption", (Fake("MatchFilter"),), TWO, p("node1", priority=HIGH),
     [p("p1", "node1", MID), p("p2", "node2", MID)], [], {"node1": ([], 0)}),
    ("a pod that fits on both nodes when lower priority pods are preempted", (), TWO, p("p", priority=HIGH, res=LARGE),
     [p("p1", "node1", MID, LARGE), p("p2", "node2", MID, LARGE)], [], {"node1": (["p1"], 0), "node2": (["p2"], 0)}),
    ("a pod that would fit on the nodes, but other pods running are higher priority, no preemption would happen", (),
     TWO, p("p", priority=LOW, res=LARGE), [p("p1", "node1", MID, LARGE), p("p2", "node2", MID, LARGE)], [], {}),
    ("medium priority pod is preempted, but lower priority one stays as it is small", (), TWO,
     p("p", priority=HIGH, res=LARGE),
     [p("p1.1", "node1", LOW, SMALL), p("p1.2", "node1", MID, LARGE), p("p2", "node2", MID, LARGE)], [],
     {"node1": (["p1.2"], 0), "node2": (["p2"], 0)}),
    ("mixed priority pods are preempted", (), TWO, p("p", priority=HIGH, res=LARGE),
     [p("p1.1", "node1", MID, SMALL), p("p1.2", "node1", LOW, SMALL), p("p1.3", "node1", MID, MEDIUM),
      p("p1.4", "node1", HIGH, SMALL), p("p2", "node2", HIGH, LARGE)], [], {"node1": (["p1.2", "p1.3"], 0)}),
    ("mixed priority pods are preempted, pick later StartTime one when priorities are equal", (), TWO,
     p("p", priority=HIGH, res=LARGE),
     [p("p1.1", "node1", LOW, SMALL, start=5), p("p1.2", "node1", LOW, SMALL, start=4),
      p("p1.3", "node1", MID, MEDIUM, start=3), p("p1.4", "node1", HIGH, SMALL, start=2),
      p("p2", "node2", HIGH, LARGE, start=1)], [], {"node1": (["p1.1", "p1.3"], 0)}),
    ("pod with anti-affinity is preempted", (), TWO, p("p", priority=HIGH, res=SMALL, labels={"foo": ""}),
     [p("p1.1", "node1", LOW, SMALL, labels={"foo": ""}, spec={"affinity": {"podAntiAffinity": {
         "requiredDuringSchedulingIgnoredDuringExecution": [
             {"labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}, "topologyKey": "hostname"}
         ]}}}),
      p("p1.2", "node1", MID, SMALL), p("p1.3", "node1", HIGH, SMALL), p("p2", "node2", HIGH, SMALL)], [],
     {"node1": (["p1.1"], 0)}),
    ("preemption to resolve pod topology spread filter failure", (), ["node-a/zone1", "node-b/zone1", "node-x/zone2"],
     p("p", priority=HIGH, labels={"foo": ""}, spec={"topologySpreadConstraints": [
         {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
          "labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}} for key in ("zone", "hostname")
     ]}),
     [p("pod-a1", "node-a", MID, labels={"foo": ""}), p("pod-a2", "node-a", LOW, labels={"foo": ""}),
      p("pod-b1", "node-b", LOW, labels={"foo": ""}), p("pod-x1", "node-x", HIGH, labels={"foo": ""}),
      p("pod-x2", "node-x", HIGH, labels={"foo": ""})], [], {"node-a": (["pod-a2"], 0), "node-b": (["pod-b1"], 0)}),
    ("get Unschedulable in the preemption phase when the filter plugins filtering the nodes", (Fake("FakeFilter"),),
     TWO, p("p", priority=HIGH, res=LARGE), [p("p1", "node1", MID, LARGE), p("p2", "node2", MID, LARGE)], [], {}),
    ("preemption with violation of same pdb", (), ["node1"], p("p", priority=HIGH, res=VERY_LARGE),
     [p("p1.1", "node1", MID, MEDIUM, labels=APP_FOO), p("p1.2", "node1", MID, MEDIUM, labels=APP_FOO)], [FOO_PDB],
     {"node1": (["p1.1", "p1.2"], 1)}),
    ("preemption with violation of the pdb with pod whose eviction was processed, the victim doesn't belong to "
     "DisruptedPods", (), ["node1"], p("p", priority=HIGH, res=VERY_LARGE),
     [p("p1.1", "node1", MID, MEDIUM, labels=APP_FOO), p("p1.2", "node1", MID, MEDIUM, labels=APP_FOO)],
     [Budget("default", "pdb", FOO_PDB.selector, 1, frozenset({"p2"}))], {"node1": (["p1.1", "p1.2"], 1)}),
    ("preemption with violation of the pdb with pod whose eviction was processed, the victim belongs to "
     "DisruptedPods", (), ["node1"], p("p", priority=HIGH, res=VERY_LARGE),
     [p("p1.1", "node1", MID, MEDIUM, labels=APP_FOO), p("p1.2", "node1", MID, MEDIUM, labels=APP_FOO)],
     [Budget("default", "pdb", FOO_PDB.selector, 1, frozenset({"p1.2"}))], {"node1": (["p1.1", "p1.2"], 0)}),
    ("preemption with violation of the pdb with pod whose eviction was processed, the victim which belongs to "
     "DisruptedPods is treated as 'nonViolating'", (), ["node1"], p("p", priority=HIGH, res=VERY_LARGE),
     [p("p1.1", "node1", MID, MEDIUM, labels=APP_FOO), p("p1.2", "node1", MID, MEDIUM, labels=APP_FOO),
      p("p1.3", "node1", MID, MEDIUM, labels=APP_FOO)],
     [Budget("default", "pdb", FOO_PDB.selector, 1, frozenset({"p1.3"}))], {"node1": (["p1.1", "p1.2", "p1.3"], 1)}),
]  # fmt: skip
LIMITS = (
    "kubegpu's preemption weighs every node: DefaultPreemptionArgs' candidate counts and the offset that rotates "
    "between cycles (which nodes a limited dry run visits) change nothing it does"
)
NOT_EXPRESSIBLE: dict[str, str] = {
    f"{POST_FILTER}/preemption result filtered out by extenders": "kubegpu runs no scheduler extenders",
    f"{DRY_RUN}/all nodes are possible candidates, but DefaultPreemptionArgs limits to 2": LIMITS,
    f"{DRY_RUN}/some nodes are not possible candidates, DefaultPreemptionArgs limits to 2": LIMITS,
    f"{DRY_RUN}/preemption offset across multiple scheduling cycles and wrap around": LIMITS,
    f"{DRY_RUN}/preemption looks past numCandidates until a non-PDB violating node is found": LIMITS,
}


def dry_run(e: Engine, nodes: list[str], incoming: PodRequest, budgets: list[Budget]) -> dict[str, Any]:
    found = {}
    for name in nodes:
        candidate = e.select_victims(incoming, name.split("/")[0], budgets)
        if candidate is not None:
            found[candidate.node] = candidate
    return found


@pytest.mark.parametrize(
    ("filters", "nodes", "incoming", "placed", "budgets", "expected"),
    [pytest.param(*c[1:], id=case_id(DRY_RUN, c[0])) for c in DRY_RUN_CASES],
)
def test_dry_run_preemption(
    filters: tuple[Fake, ...],
    nodes: list[str],
    incoming: PodRequest,
    placed: list[PodRequest],
    budgets: list[Budget],
    expected: dict[str, tuple[list[str], int]],
) -> None:
    found = dry_run(cluster(nodes, placed, filters=filters), nodes, incoming, budgets)
    got = {name: (sorted(v.name for v in c.victims), c.violations) for name, c in found.items()}
    assert got == expected


# -- TestSelectBestCandidate -----------------------------------------------------------------------------------------

# (upstream case name, nodes, the pod, the existing pods, the nodes any of which may be picked)
BestRow = tuple[str, list[str], PodRequest, list[PodRequest], list[str]]
THREE = ["node1", "node2", "node3"]
PP = p("p", priority=HIGH, res=VERY_LARGE)
BEST_CASES: list[BestRow] = [
    ("No node needs preemption", ["node1"], p("p", priority=HIGH, res=LARGE), [p("p1", "node1", MID, SMALL, start=0)],
     ["node1"]),
    ("a pod that fits on both nodes when lower priority pods are preempted", TWO, p("p", priority=HIGH, res=LARGE),
     [p("p1", "node1", MID, LARGE, start=0), p("p2", "node2", MID, LARGE, start=0)], ["node1", "node2"]),
    ("node with min highest priority pod is picked", THREE, PP,
     [p("p1.1", "node1", MID, MEDIUM, start=0), p("p1.2", "node1", MID, LARGE, start=0),
      p("p2.1", "node2", MID, MEDIUM, start=0), p("p2.2", "node2", LOW, MEDIUM, start=0),
      p("p3.1", "node3", LOW, MEDIUM, start=0), p("p3.2", "node3", LOW, MEDIUM, start=0)], ["node3"]),
    ("when highest priorities are the same, minimum sum of priorities is picked", THREE, PP,
     [p("p1.1", "node1", MID, MEDIUM, start=0), p("p1.2", "node1", MID, LARGE, start=0),
      p("p2.1", "node2", MID, LARGE, start=0), p("p2.2", "node2", LOW, MEDIUM, start=0),
      p("p3.1", "node3", MID, MEDIUM, start=0), p("p3.2", "node3", MID, MEDIUM, start=0)], ["node2"]),
    ("when highest priority and sum are the same, minimum number of pods is picked", THREE, PP,
     [p("p1.1", "node1", MID, SMALL, start=0), p("p1.2", "node1", NEG, SMALL, start=0),
      p("p1.3", "node1", MID, SMALL, start=0), p("p1.4", "node1", NEG, SMALL, start=0),
      p("p2.1", "node2", MID, LARGE, start=0), p("p2.2", "node2", NEG, MEDIUM, start=0),
      p("p3.1", "node3", MID, MEDIUM, start=0), p("p3.2", "node3", NEG, SMALL, start=0),
      p("p3.3", "node3", LOW, SMALL, start=0)], ["node2"]),
    ("sum of adjusted priorities is considered", THREE, PP,
     [p("p1.1", "node1", MID, SMALL, start=0), p("p1.2", "node1", NEG, SMALL, start=0),
      p("p1.3", "node1", NEG, SMALL, start=0), p("p2.1", "node2", MID, LARGE, start=0),
      p("p2.2", "node2", NEG, MEDIUM, start=0), p("p3.1", "node3", MID, MEDIUM, start=0),
      p("p3.2", "node3", NEG, SMALL, start=0), p("p3.3", "node3", LOW, SMALL, start=0)], ["node2"]),
    ("non-overlapping lowest high priority, sum priorities, and number of pods", ["node1", "node2", "node3", "node4"],
     p("p", priority=VERY_HIGH, res=VERY_LARGE),
     [p("p1.1", "node1", MID, SMALL, start=0), p("p1.2", "node1", LOW, SMALL, start=0),
      p("p1.3", "node1", LOW, SMALL, start=0), p("p2.1", "node2", HIGH, LARGE, start=0),
      p("p3.1", "node3", MID, MEDIUM, start=0), p("p3.2", "node3", LOW, SMALL, start=0),
      p("p3.3", "node3", LOW, SMALL, start=0), p("p3.4", "node3", LOW, MEDIUM, start=0),
      p("p4.1", "node4", MID, MEDIUM, start=0), p("p4.2", "node4", MID, SMALL, start=0),
      p("p4.3", "node4", MID, SMALL, start=0), p("p4.4", "node4", NEG, SMALL, start=0)], ["node1"]),
    ("same priority, same number of victims, different start time for each node's pod", THREE, PP,
     [p("p1.1", "node1", MID, MEDIUM, start=2), p("p1.2", "node1", MID, MEDIUM, start=2),
      p("p2.1", "node2", MID, MEDIUM, start=3), p("p2.2", "node2", MID, MEDIUM, start=3),
      p("p3.1", "node3", MID, MEDIUM, start=1), p("p3.2", "node3", MID, MEDIUM, start=1)], ["node2"]),
    ("same priority, same number of victims, different start time for all pods", THREE, PP,
     [p("p1.1", "node1", MID, MEDIUM, start=4), p("p1.2", "node1", MID, MEDIUM, start=2),
      p("p2.1", "node2", MID, MEDIUM, start=5), p("p2.2", "node2", MID, MEDIUM, start=1),
      p("p3.1", "node3", MID, MEDIUM, start=3), p("p3.2", "node3", MID, MEDIUM, start=6)], ["node3"]),
    ("different priority, same number of victims, different start time for all pods", THREE, PP,
     [p("p1.1", "node1", LOW, MEDIUM, start=4), p("p1.2", "node1", MID, MEDIUM, start=2),
      p("p2.1", "node2", MID, MEDIUM, start=6), p("p2.2", "node2", LOW, MEDIUM, start=1),
      p("p3.1", "node3", LOW, MEDIUM, start=3), p("p3.2", "node3", MID, MEDIUM, start=5)], ["node2"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "incoming", "placed", "expected"),
    [pytest.param(*c[1:], id=case_id(BEST, c[0])) for c in BEST_CASES],
)
def test_select_best_candidate(
    nodes: list[str], incoming: PodRequest, placed: list[PodRequest], expected: list[str]
) -> None:
    e = cluster(nodes, placed)
    chosen = pick(list(dry_run(e, nodes, incoming, []).values()))
    assert chosen is not None and chosen.node in expected
    if not e.decide(incoming).scheduled:  # the whole PostFilter picks the same
        assert e.preempt(incoming).node in expected
