"""How preemption searches: as kube-scheduler's dry run, on a copy of each node, stopping at enough candidates.

A preemption on a large cluster must not cost a what-if on every node, nor leave the nodes it tried changed (each
change throws away the nodes' remembered answers and shows up in `changed_since`, which the extender's answers
follow). And however it searches, the victims it names must be the ones a plain search by kube-scheduler's rules
names: the property tests below hold the engine against such a search, written out here on random small clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import LabelSelector, PodRequest, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.preemption import Budget, candidates_wanted

GI = 1 << 30


def engine() -> Engine:
    return Engine(make_plugin_manager("scheduler", plugins=[], autoload=False))


def add_node(e: Engine, name: str, cpu_milli: int = 4000, memory_gi: int = 32, pods: int = 110) -> None:
    e.add_node(
        node_info(
            node_manifest(
                name,
                labels={"kubernetes.io/hostname": name},
                allocatable={"cpu": f"{cpu_milli}m", "memory": f"{memory_gi}Gi", "pods": str(pods)},
            )
        )
    )


def pod(
    name: str,
    cpu_milli: int,
    priority: int = 0,
    *,
    memory_gi: int = 0,
    port: int = 0,
    app: str | None = None,
    started: str | None = None,
) -> PodRequest:
    container: dict[str, Any] = {"name": "c", "resources": {"requests": {"cpu": f"{cpu_milli}m"}}}
    if memory_gi:
        container["resources"]["requests"]["memory"] = f"{memory_gi}Gi"
    if port:
        container["ports"] = [{"containerPort": port, "hostPort": port}]
    doc: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app} if app else {}},
        "spec": {"priority": priority, "containers": [container]},
        "status": {"startTime": started} if started else {},
    }
    return pod_request(doc)[0]


def full_cluster(nodes: int) -> Engine:
    """kube-scheduler's Preemption benchmark (test/integration/scheduler_perf): nodes of 4 cpus, each holding four
    low-priority pods of 900m, so that a pod of 3000m fits only by evicting three of them."""
    e = engine()
    for i in range(nodes):
        add_node(e, f"n{i:03d}")
    for i in range(4 * nodes):
        assert e.schedule(pod(f"low-{i}", 900)).scheduled
    return e


def test_a_preemption_on_a_large_cluster_stops_at_enough_candidates() -> None:
    e = full_cluster(300)
    high = pod("high", 3000, priority=10)
    preemption = e.preempt(high)
    assert preemption.node is not None and len(preemption.victims) == 3
    assert len(preemption.candidates) == candidates_wanted(300) == 100


def test_the_next_preemption_tries_other_nodes_first() -> None:
    e = full_cluster(300)
    first = e.preempt(pod("high-0", 3000, priority=10))
    second = e.preempt(pod("high-1", 3000, priority=10))
    assert {c.node for c in first.candidates}.isdisjoint(c.node for c in second.candidates)


def test_a_preemption_changes_no_node() -> None:
    e = full_cluster(20)
    generation = e.generation
    preemption = e.preempt(pod("high", 3000, priority=10))
    assert preemption.node is not None
    assert e.changed_since(generation) == set()


# -- the engine against a plain search by kube-scheduler's rules ----------------------------------------------------


@dataclass(frozen=True)
class Held:
    name: str
    cpu: int
    memory: int
    port: int
    priority: int
    app: str | None
    started: str


def fits(cpu: int, memory: int, pods: int, node: tuple[int, int, int], held: list[Held], want: Held) -> bool:
    used_cpu = sum(h.cpu for h in held)
    used_memory = sum(h.memory for h in held)
    ports = {h.port for h in held if h.port}
    return (
        len(held) + 1 <= node[2]
        and used_cpu + want.cpu <= node[0]
        and used_memory + want.memory <= node[1]
        and not (want.port and want.port in ports)
    )


def reference_victims(
    node: tuple[int, int, int], held: list[Held], want: Held, allowed: dict[str, int]
) -> tuple[list[Held], int] | None:
    """kube-scheduler 1.20's selectVictimsOnNode written plainly: all lower pods out; if the pod then fits, put
    them back most important first (budget violators first), keeping each whose return still leaves room."""
    higher = [h for h in held if h.priority >= want.priority]
    lower = [h for h in held if h.priority < want.priority]
    if not lower or not fits(0, 0, 0, node, higher, want):
        return None
    ordered = sorted(lower, key=lambda h: (-h.priority, h.started))
    budget = dict(allowed)
    violating, others = [], []
    for h in ordered:
        violated = False
        if h.app in budget:
            budget[h.app] -= 1
            violated = budget[h.app] < 0
        (violating if violated else others).append(h)
    kept, victims, violations = list(higher), [], 0
    for h in violating + others:
        if fits(0, 0, 0, node, [*kept, h], want):
            kept.append(h)
        else:
            victims.append(h)
            violations += h in violating
    return victims, violations


def criteria(victims: list[Held], violations: int) -> tuple[int, ...]:
    """kube-scheduler's pickOneNodeForPreemption, less its last tie-break (the latest start)."""
    return (
        violations,
        max((v.priority for v in victims), default=-(1 << 31)),
        sum(v.priority + (1 << 31) for v in victims),
        len(victims),
    )


held_pods = st.builds(
    lambda cpu, memory, port, priority, app: (cpu, memory, port, priority, app),
    st.sampled_from([100, 500, 900, 1500, 2500]),
    st.integers(0, 8),
    st.sampled_from([0, 0, 0, 8080]),
    st.integers(0, 5),
    st.sampled_from([None, "a", "b"]),
)
clusters = st.lists(
    st.tuples(
        st.sampled_from([2000, 4000]), st.sampled_from([8, 32]), st.integers(2, 6), st.lists(held_pods, max_size=6)
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(
    clusters,
    st.sampled_from([1000, 2500, 3500]),
    st.sampled_from([0, 8]),
    st.sampled_from([0, 8080]),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 2)),
)
def test_the_victims_are_those_a_plain_search_chooses(
    cluster: list[tuple[int, int, int, list[tuple[int, int, int, int, str | None]]]],
    cpu: int,
    memory: int,
    port: int,
    allowed: dict[str, int],
) -> None:
    e = engine()
    on: dict[str, list[Held]] = {}
    shapes: dict[str, tuple[int, int, int]] = {}
    for n, (node_cpu, node_memory, node_pods, pods) in enumerate(cluster):
        name = f"n{n}"
        add_node(e, name, node_cpu, node_memory, node_pods)
        shapes[name] = (node_cpu, node_memory * GI, node_pods)
        on[name] = []
        for i, (p_cpu, p_memory, p_port, priority, app) in enumerate(pods):
            held = Held(f"p{n}-{i}", p_cpu, p_memory * GI, p_port, priority, app, f"2026-01-01T00:{n:02d}:{i:02d}Z")
            request = pod(held.name, p_cpu, priority, memory_gi=p_memory, port=p_port, app=app, started=held.started)
            if e.reserve(request, name).scheduled:
                on[name].append(held)
    want = Held("want", cpu, memory * GI, port, 6, None, "")
    budgets = [
        Budget("default", app, LabelSelector((Requirement("app", "In", (app,)),)), allowed=count)
        for app, count in allowed.items()
    ]
    generation = e.generation
    preemption = e.preempt(pod("want", cpu, 6, memory_gi=memory, port=port), budgets)
    assert e.changed_since(generation) == set()

    reference = {}
    for name, held in on.items():
        if fits(0, 0, 0, shapes[name], held, want):
            continue  # the pod fits there: no preemption needed on that node
        found = reference_victims(shapes[name], held, want, allowed)
        if found is not None:
            reference[name] = found
    event("a node to preempt on" if reference else "none")
    if not reference:
        assert preemption.node is None
        return
    assert preemption.node in reference
    best = min(criteria(*found) for found in reference.values())
    victims, violations = reference[preemption.node]
    assert criteria(victims, violations) == best
    assert sorted(preemption.victims) == sorted(f"default/{v.name}" for v in victims)
    assert preemption.violations == violations


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["place", "place", "release", "preempt", "preempt", "nominate"]),
            st.integers(0, 60),
            st.sampled_from([500, 900, 1500]),
        ),
        max_size=40,
    )
)
def test_a_remembered_dry_run_answers_as_a_fresh_one(story: list[tuple[str, int, int]]) -> None:
    """Each node remembers its last dry run (`NodeRecord.last_victims`); an engine that forgets it must agree."""
    memoized, oracle = engine(), engine()
    for e in (memoized, oracle):
        for n in range(3):
            add_node(e, f"n{n}", cpu_milli=2000, pods=4)
    preemptors = [pod("want-a", 1500, 5), pod("want-b", 900, 5), pod("want-c", 1500, 3)]
    placed: list[str] = []
    for serial, (op, arg, cpu) in enumerate(story):
        if op == "place":
            request = pod(f"p{serial}", cpu, priority=arg % 5, app="a" if arg % 2 else None)
            decision = memoized.schedule(request)
            assert oracle.schedule(request).node == decision.node
            if decision.scheduled:
                placed.append(request.key)
        elif op == "release" and placed:
            key = placed.pop(arg % len(placed))
            for e in (memoized, oracle):
                e.release(key)
        elif op == "nominate":
            node = f"n{arg % 4}" if arg % 4 < 3 else None
            for e in (memoized, oracle):
                e.nominate(preemptors[arg % 3], node)
        elif op == "preempt":
            budgets = [Budget("default", "a", LabelSelector((Requirement("app", "In", ("a",)),)), allowed=arg % 2)]
            oracle.forget_memos()
            request = preemptors[arg % 3]
            assert memoized.preempt(request, budgets) == oracle.preempt(request, budgets)
