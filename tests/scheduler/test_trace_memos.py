"""The memos that make a trace replay fast place every pod where the uncached computation places it.

Four memos stand between a replay and its placements: the engine's local raw scores shared by nodes alike in all the
scores read (`Scoring.scoring_content`, numbered: `LocalRaws.by_number`), the nvidia placements, fit answers and scores
shared by GPU states alike in all `place` reads (`PlacementBook`, across the mix's versions where no mix decides them),
the FGD measure remembered per table (`FragmentationTable.measured`) and the plugin's fragmentation answers per table
(`FragmentationTable.deltas`). The oracle is the same replay with the four of them turned off; the traces are
generated here (the suite runs without ../shared): nodes of the openb trace's kinds, pods of its shapes (shares, whole
GPUs, several GPUs, model constraints, cpu-only), every node scored and the policy's first few, the experiment and a
timeline with departures.
"""

from __future__ import annotations

import dataclasses
import random
from bisect import bisect_right
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia import sharing
from kubegpu.scheduler import scores, traces
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.engine.scoring import Scoring

NODE_KINDS = [(96000, 393216, 8, "G2"), (104000, 524288, 2, "T4"), (16000, 122880, 2, "P100"), (8000, 32768, 1, "A10")]
MODELS = [(), (), (), ("T4",), ("G2", "T4"), ("P100",)]


def generated_trace(
    seed: int, nodes: int = 40, pods: int = 300
) -> tuple[list[traces.TraceNode], list[traces.TracePod]]:
    rng = random.Random(seed)
    node_list = []
    for i in range(nodes):
        cpu, memory, gpus, model = NODE_KINDS[rng.randrange(len(NODE_KINDS))]
        node_list.append(traces.TraceNode(f"node-{i}", cpu, memory, gpus, model))
    pod_list = []
    for i in range(pods):
        kind = rng.random()
        gpus, milli = (
            (0, 0)
            if kind < 0.15
            else (1, rng.choice([250, 300, 470, 500, 650, 810]))
            if kind < 0.6
            else (
                rng.choice([1, 1, 2, 4, 8]),
                1000,
            )
        )
        cpu = rng.choice([1000, 3152, 8000, 11908, 12500, 32000])
        memory = rng.choice([2048, 5600, 30517, 47104])
        created = rng.randrange(0, 1000)
        deleted = created + rng.randrange(0, 400) if rng.random() < 0.5 else None
        models = rng.choice(MODELS) if gpus else ()
        pod_list.append(traces.TracePod(f"pod-{i}", cpu, memory, gpus, milli, models, created, deleted))
    return node_list, pod_list


def engine(percentage: int, policy: str) -> Engine:
    profile = dataclasses.replace(
        scores.Profile.default("binpack"), percentage_of_nodes_to_score=percentage, share_policy=policy
    )
    return Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), scoring=profile)


def uncached_measure(free: Sequence[int], table: sharing.FragmentationTable, cpu: int) -> int:
    fresh = sharing.FragmentationTable(table.cpus, table.millis, table.most, table.weight, table.kinds)
    row = fresh.row(bisect_right(table.cpus, cpu))  # neither the measure nor the row remembered
    return sharing._fragmentation(tuple(free), table, row)


def uncached_fragmentation(free: Sequence[int], table: sharing.FragmentationTable, cpu: int = sharing.ANY_CPU) -> float:
    if not table.weight:
        return 0.0
    return uncached_measure(free, table, cpu) / table.weight


class Forgetful(dict[tuple[int, int, int, int], tuple[object, float | None]]):
    """A table's fragmentation answers (`FragmentationTable.deltas`) that never answers from memory."""

    def get(self, key: object, default: object = None) -> None:  # type: ignore[override]
        return None


def without_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Scoring, "scoring_content", lambda self, record: None)
    monkeypatch.setattr(nvidia.PlacementBook, "get", lambda self, what, workload, number, ask: nvidia._MISSING)
    monkeypatch.setattr(sharing, "_measure", uncached_measure)
    table = sharing.Workload.table

    def forgetful_table(self: sharing.Workload, models: sharing.Models = None) -> sharing.FragmentationTable:
        made = table(self, models)
        if not isinstance(made.deltas, Forgetful):
            object.__setattr__(made, "deltas", Forgetful())  # frozen, as the plugin reads it
        return made

    monkeypatch.setattr(sharing.Workload, "table", forgetful_table)


def placements(percentage: int, policy: str, mode: traces.Mode, seed: int) -> list[tuple[object, object]]:
    nodes, pods = generated_trace(seed)
    result = traces.replay(engine(percentage, policy), nodes, pods, mode, seed=seed)
    return [(event["pod"], event["node"]) for event in result.events]


@pytest.mark.parametrize(
    ("percentage", "policy", "mode"),
    [(100, "fgd", "experiment"), (0, "fgd", "experiment"), (100, "bestfit", "experiment"), (100, "fgd", "timeline")],
)
def test_a_replay_places_every_pod_where_the_uncached_computation_does(
    percentage: int, policy: str, mode: traces.Mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seed in (1,):
        fast = placements(percentage, policy, mode, seed)
        with monkeypatch.context() as patched:
            without_memos(patched)
            slow = placements(percentage, policy, mode, seed)
        assert sum(1 for _, node in fast if node) > 50  # the trace placed pods, and some failed
        assert fast == slow


SHAPES = [(0, 0), (1, 250), (1, 500), (1, 810), (1, 1000), (2, 1000), (4, 1000)]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_shared_placements_and_measures_equal_each_node_computed_alone(
    arrivals: list[tuple[int, int]], policy: str
) -> None:
    # Nodes of two kinds take random pods; then, for every node and every shape, the placement its state gives
    # (`plan`, through the engine's shared book) is `place` on that state, its fit answer the one computed for it
    # alone, and the FGD measure of its GPUs the one computed afresh.
    subject = engine(100, policy)
    for i in range(8):
        cpu, memory, gpus, model = NODE_KINDS[i % 2]
        subject.add_node(node_info(traces.node_document(traces.TraceNode(f"node-{i}", cpu, memory, gpus, model))))
    for i, (shape, cpu) in enumerate(arrivals):
        gpus, milli = SHAPES[shape]
        subject.schedule(
            pod_request(traces.pod_document(traces.TracePod(f"p{i}", cpu, 1024, gpus, milli, ()), f"p{i}"))[0]
        )
    for shape in range(1, len(SHAPES)):
        gpus, milli = SHAPES[shape]
        request = pod_request(traces.pod_document(traces.TracePod("ask", 1000, 1024, gpus, milli, ()), "ask"))[0]
        ask = nvidia.read_ask(request)
        for name in subject.node_names():
            state = subject.nodes[name].states["nvidia"]
            assert isinstance(state, nvidia.NvidiaNodeState)
            mask, reason = nvidia.eligible_gpus(state, ask)
            assert state.plan(ask) == (None if reason else nvidia.place(state, mask, ask))
            assert nvidia.plugin.kubegpu_scheduler_fit(state, request, ask) == nvidia.fit_answer(state, ask)
            table = state.workload.table()
            for cpu in (0, 4000, sharing.ANY_CPU):
                assert sharing.node_fragmentation(state.free_millis(), table, cpu) == uncached_fragmentation(
                    state.free_millis(), table, cpu
                )


def test_pods_alike_in_their_gpus_share_one_ask_and_so_its_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    # The PlacementBook keeps answers by the ask's identity: pod shapes that differ only in cpu or memory read one
    # ask object (`read_ask`), so a placement made for one is the other's; equal in value, they place alike (the
    # replay oracle above holds the placements against the book turned off).
    def ask(cpu: int, memory: int, gpus: int, milli: int, models: tuple[str, ...] = ()) -> nvidia.NvidiaPodState:
        pod = traces.TracePod(f"p-{cpu}-{memory}", cpu, memory, gpus, milli, models)
        return nvidia.read_ask(pod_request(traces.pod_document(pod, pod.name))[0])

    assert ask(1000, 2048, 1, 500) is ask(32000, 47104, 1, 500)
    assert ask(1000, 2048, 2, 1000) is ask(8000, 2048, 2, 1000)
    assert ask(1000, 2048, 1, 500) != ask(1000, 2048, 1, 250)
    # The trace's GPU model is the pod's node affinity, which the engine's filters answer, not the ask.
    assert ask(1000, 2048, 1, 500, ("T4",)) is ask(1000, 2048, 1, 500)
    monkeypatch.setattr(nvidia, "ASKS_INTERNED", 4)
    monkeypatch.setattr(nvidia, "_asks", {})
    for milli in range(100, 1000, 50):  # a tenant's ever new asks: the kept ones stay bounded
        ask(1000, 2048, 1, milli)
        assert len(nvidia._asks) <= 4
