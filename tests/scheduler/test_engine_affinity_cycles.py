"""The inter-pod cycles' shortcuts place exactly as the walk and the ranking node by node.

Pods with inter-pod rules or topology spread cannot use the shape's remembered answers (`engine.sampling`): they walk
the node tree (`Cycle._schedule_sampled`) and rank the nodes found (`Scoring._rank`). Two shortcuts remove work
there without changing an answer:

* `Cycle._sample_passing`: where every node passes the shape's node-local filters and the cluster-wide rules named
  the nodes they refuse, the sample is the first nodes of the tree's order from the rotating start that no rule
  named, found without a step per node in Python;
* `Scoring._rank`: the local score plugins' part of the totals worked out once per distinct tuple of raw scores;
  InterPodAffinity's and PodTopologySpread's normalizations once per distinct raw score, and PodTopologySpread's raw
  scores a constraint at a time where every node holds every topology key (`scores._spread_raws_keyed`).

The oracle of the first two is the same engine with them off (`_sample_passing` answering None, `_rank` ranking
node by node), on generated event sequences: pods of kube-scheduler's benchmark kinds (anti-affinity per host, zone
spread with a soft spread over hosts, preferred affinity to another app's zone, plain) arriving and leaving, nodes
relabelled into another zone or out of every zone, removed and added back; of the last, the functions node by node.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import pod_request
from kubegpu.core.models import LabelSelector, PodRequest, SpreadConstraint
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine, kubescores

from . import test_engine_sampling as sampling_traces

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
APPS = 9


def node(name: str, zone: str | None, cpu: str = "64") -> Any:
    labels = {HOSTNAME: name, **({ZONE: zone} if zone else {})}
    return make_node(name, labels=labels, allocatable={}, cpu=cpu, memory="256Gi")


def pod(i: int, app: int, kind: str, cpu: str = "500m") -> PodRequest:
    """Pod `i` of app `app`: `anti` one per host, `spread` spread over zones (softly over hosts), `drawn` drawn to
    the next app's zone, `plain` none of these."""
    labels = {"app": f"app-{app}"}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
    }
    if kind == "anti":
        term = {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": labels}}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    elif kind == "spread":
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": labels}},
            {"maxSkew": 1, "topologyKey": HOSTNAME, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": labels}},
        ]  # fmt: skip
    elif kind == "drawn":
        term = {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": f"app-{(app + 1) % APPS}"}}}
        spec["affinity"] = {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term}]
            }
        }
    manifest = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                "metadata": {"name": f"p{i}", "namespace": "bench", "labels": labels, "uid": f"uid-{i}"}}  # fmt: skip
    return pod_request(manifest)[0]


def by_node(engine: Engine) -> Engine:
    """The engine with both shortcuts off."""
    engine._sample_passing = lambda *walk: None  # type: ignore[method-assign]
    engine._rank = engine._rank_by_node  # type: ignore[method-assign]
    return engine


def replay(subject: Engine, seed: int, nodes: int, steps: int) -> list[object]:
    """Each step's outcome: a cycle's decision and where the next sample starts, or the event applied."""
    rng = random.Random(seed)
    zones = ("zone-0", "zone-1", "zone-2")
    for n in range(nodes):
        subject.add_node(node(f"n{n:03d}", zones[n % 3]))
    placed: list[str] = []
    removed: list[str] = []
    seen: list[object] = []
    for step in range(steps):
        roll = rng.random()
        if roll < 0.12 and placed:
            key = placed.pop(rng.randrange(len(placed)))
            subject.release(key)
            seen.append(("released", key))
        elif roll < 0.16:
            name = f"n{rng.randrange(nodes):03d}"
            if name not in removed:
                zone, cpu = rng.choice((*zones, None)), rng.choice(("64", "64", "64", "1"))
                subject.add_node(node(name, zone, cpu))  # relabelled or shrunk, its pods kept
                seen.append(("relabelled", name, zone, cpu))
        elif roll < 0.18:
            name = f"n{rng.randrange(nodes):03d}"
            if name not in removed:
                gone = subject.remove_node(name)
                placed = [key for key in placed if key not in gone]
                removed.append(name)
                seen.append(("removed", name, sorted(gone)))
        elif roll < 0.20 and removed:
            name = removed.pop(0)
            subject.add_node(node(name, rng.choice(zones)))
            seen.append(("added", name))
        else:
            app = rng.randrange(APPS)
            kind = ("anti", "spread", "drawn")[app % 3] if rng.random() < 0.9 else "plain"
            request = pod(step, app, kind, "500m" if rng.random() < 0.95 else rng.choice(("16", "100")))
            decision = subject.schedule(request)
            seen.append((request.key, decision.node, decision.reason, decision.code, subject._next_start))
            if decision.scheduled:
                placed.append(request.key)
    return seen


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_inter_pod_cycles_place_as_the_walk_and_ranking_node_by_node(seed: int) -> None:
    """130 to 180 nodes (kube-scheduler's adaptive sample of 100 is smaller), 300 events; most inter-pod cycles
    take the walk's shortcut. Some pods ask for more cpu than a shrunk node has, or than any node has."""
    nodes = random.Random(seed).randint(130, 180)
    taken: list[bool] = []
    subject = Engine(make_plugin_manager("scheduler"))
    shortcut = subject._sample_passing

    def counted(*walk: Any) -> Any:
        answer = shortcut(*walk)
        taken.append(answer is not None)
        return answer

    subject._sample_passing = counted  # type: ignore[method-assign]
    oracle = by_node(Engine(make_plugin_manager("scheduler")))
    assert replay(subject, seed, nodes, 300) == replay(oracle, seed, nodes, 300)
    assert sum(taken) > len(taken) // 2, "most walks took the shortcut (else this test holds nothing)"


def test_a_walk_that_finds_too_few_nodes_starts_the_next_sample_where_it_started() -> None:
    """kube-scheduler's `nextStartNodeIndex`: after a full sample the next starts past the last node found; after
    one that found fewer nodes than it wanted (every node visited), where this one did. 150 nodes, a sample of 100
    (a placed pod's preferred term draws app 0's pods, so InterPodAffinity ranks them): 60 pods of app 0, one per
    host, leave 90 hosts for the next."""
    subject, oracle = Engine(make_plugin_manager("scheduler")), by_node(Engine(make_plugin_manager("scheduler")))
    for engine in (subject, oracle):
        for n in range(150):
            engine.add_node(node(f"n{n:03d}", ("zone-0", "zone-1", "zone-2")[n % 3]))
        assert engine.schedule(pod(1000, APPS - 1, "drawn")).scheduled
        engine._next_start = 7
    starts = []
    for i in range(61):
        decisions = [engine.schedule(pod(i, 0, "anti")) for engine in (subject, oracle)]
        assert decisions[0].scheduled and decisions[0].node == decisions[1].node
        assert subject._next_start == oracle._next_start
        starts.append(subject._next_start)
    assert starts[0] == 107, "the first 100 nodes from 7 fit"
    assert starts[-1] == starts[-2], "the 61st pod's sample found 90 hosts of 100 wanted: the start stays"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-300, 300), max_size=40), st.lists(st.integers(0, 300), max_size=40))
def test_normalizing_per_distinct_score_equals_node_by_node(affinity: list[int], spread: list[int]) -> None:
    """InterPodAffinity's min..max (0 included) and PodTopologySpread's fewer-is-better, over every node's score."""
    assert kubescores.InterPodAffinity().normalize(None, list(map(float, affinity))) == list(
        map(float, scores.normalize_affinity(affinity))
    )
    cycle = kubescores._SpreadCycle(())
    cycle.ignored = [False] * len(spread)
    assert kubescores.PodTopologySpread().normalize(cycle, list(map(float, spread))) == list(
        map(float, scores.normalize_spread(spread, cycle.ignored))
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(("z1", "z2", "z3")), st.integers(0, 4)), min_size=1, max_size=30),
    st.lists(st.integers(0, 9), min_size=3, max_size=3),
    st.integers(1, 3),
)
def test_spread_raws_keyed_equal_each_nodes_raw_score(
    nodes: list[tuple[str, int]], zones: list[int], skew: int
) -> None:
    """PodTopologySpread's raw scores a constraint at a time (every node labelled) equal `spread_raw` node by node:
    a zone constraint counted per pair, a hostname constraint per node."""
    selector = LabelSelector(())
    constraints = (
        SpreadConstraint(skew, ZONE, "ScheduleAnyway", selector),
        SpreadConstraint(1, HOSTNAME, "ScheduleAnyway", selector),
    )
    named = [(f"n{i}", {ZONE: zone, HOSTNAME: f"n{i}"}) for i, (zone, _) in enumerate(nodes)]
    counts = {(ZONE, zone): found for zone, found in zip(("z1", "z2", "z3"), zones, strict=True)}
    hosts = {f"n{i}": found for i, (_, found) in enumerate(nodes) if found}
    state = scores.SpreadScores(constraints, set(), counts, (1.3862943611198906, 3.58351893845611), (None, hosts))
    probe = pod(0, 0, "plain")
    assert scores.spread_raws(state, probe, named) == [
        scores.spread_raw(state, probe, n, labels) for n, labels in named
    ]


@pytest.mark.parametrize("lead", [True, False], ids=["fragmentation leads", "fragmentation weighed"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_gpu_cycles_rank_as_node_by_node(seed: int, lead: bool) -> None:
    """`_rank` over device pods (shares, whole and multi-GPU, CPU-only; nodes filling and freeing) picks the node
    `_rank_by_node` picks, KubegpuFragmentation leading or weighed with the others."""
    rng = random.Random(seed)
    nodes = sampling_traces.generated_nodes(rng, rng.randint(130, 170))
    pods = sampling_traces.generated_pods(rng, 500)

    def engine() -> Engine:
        profile = dataclasses.replace(scores.Profile.default("binpack"), fragmentation_lead=lead)
        plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
        return Engine(plugins, scoring=profile)

    # Both walk node by node (the shape's remembered answers rank with `_rank_sampled`): every cycle ranks here.
    subject, oracle = sampling_traces.walking(engine()), sampling_traces.walking(engine())
    oracle._rank = oracle._rank_by_node  # type: ignore[method-assign]
    assert sampling_traces.replay(subject, nodes, pods) == sampling_traces.replay(oracle, nodes, pods)
