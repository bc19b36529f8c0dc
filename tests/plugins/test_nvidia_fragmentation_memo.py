"""The nvidia plugin's fragmentation answers remembered per mix table (`FragmentationTable.deltas`), and its device
scores kept across the mix's versions (`PlacementBook.steady`), are the answers computed afresh.

A replay asks `kubegpu_scheduler_fragmentation` of every node content a shape ranks, again at each move of the
learned mix; the answer reads the node's GPU content (its free GPUs and where the pod's GPUs go: `place`), the ask,
and of the node's free cpu and the pod's cpu only which of the mix's kinds still run there before and after. The
oracle here: nodes of the openb trace's kinds take random pods (the mix moving as they come), then every node's
answer to pods of every shape and of several cpu requests, through the memo, asked twice, is `fragmentation_grown`
on a copy of the node's table without its memos (the same mix).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.models import PodRequest
from kubegpu.core.testing import make_pod
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia.sharing import Workload

from .test_nvidia_fit_mix import (
    OTHER_MIX,
    SHAPES,
    SHARE_ASKS,
    asked_after_each_arrival,
    request,
    six_nodes,
    under_mixes,
)

CPUS = [0, 1000, 8000, 32000, 90000]


def nvidia_pod(containers: dict[str, dict[str, int]]) -> PodRequest:
    return make_pod("share", containers)


def every_ask() -> list[PodRequest]:
    """Pods of every shape, of each share ask, and of two share containers (the mix places the second share)."""
    asks = [request(gpus, milli) for gpus, milli in SHAPES[1:]]
    asks += [nvidia_pod({"main": resources}) for resources in SHARE_ASKS]
    asks.append(nvidia_pod({"a": SHARE_ASKS[0], "b": SHARE_ASKS[0]}))
    return asks


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_a_remembered_fragmentation_answer_is_the_answer_computed_afresh(
    arrivals: list[tuple[int, int]], policy: str
) -> None:
    engine = six_nodes(policy)
    hook = nvidia.plugin.kubegpu_scheduler_fragmentation
    for i, (shape, cpu) in enumerate(arrivals):
        gpus, milli = SHAPES[shape]
        engine.schedule(request(gpus, milli, f"p{i}", cpu))
        for gpus, milli in SHAPES:
            for pod_cpu in CPUS:
                pod = request(gpus, milli, "ask", pod_cpu)
                ask = nvidia.read_ask(pod) if gpus else None
                for name in engine.node_names():
                    record = engine.nodes[name]
                    state = record.states["nvidia"]
                    assert isinstance(state, nvidia.NvidiaNodeState)
                    free = {"cpu": record.free("cpu"), "memory": record.free("memory")}
                    first = hook(state, pod, ask, free)
                    again = hook(state, pod, ask, free)
                    table = replace(state.fragmentation_table(), rows={}, measured={}, deltas={})  # the mix, no memo
                    fresh = nvidia.fragmentation_grown(state, pod, ask, table, free["cpu"]) if table.weight else None
                    assert first == again == fresh, (name, gpus, milli, pod_cpu, free)


def test_the_answer_follows_the_cpu_levels_of_the_mix_not_the_cpu_itself() -> None:
    """Two pods of one ask whose cpu leaves the same kinds running share an answer; one whose cpu shuts a kind out
    of the node gets its own."""
    engine = six_nodes("fgd")
    record = engine.nodes["node-0"]  # 96 cores, 8 GPUs, all free
    state = record.states["nvidia"]
    assert isinstance(state, nvidia.NvidiaNodeState)
    state.workload = Workload.configured(OTHER_MIX)  # kinds asking 1, 32 and 64 cores
    free = {"cpu": record.free("cpu"), "memory": record.free("memory")}
    hook = nvidia.plugin.kubegpu_scheduler_fragmentation
    pods = [request(1, 250, "a", 100), request(1, 250, "b", 200), request(1, 250, "c", 40000)]
    answers = [hook(state, pod, nvidia.read_ask(pod), free) for pod in pods]
    assert answers[0] == answers[1] != answers[2]  # c leaves 56 cores: the 64-core kind no longer runs there
    assert len(state.fragmentation_table().deltas) == 2


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_a_score_kept_across_mix_versions_is_the_score_under_any_mix(
    arrivals: list[tuple[int, int]], policy: str
) -> None:
    # The device score of an ask, which no mix decides, is kept across the mix's versions
    # (`PlacementBook.steady`): the oracle is `place` itself, under the learned mix, another, and none.
    engine = six_nodes(policy)
    for name, state, pod, ask in asked_after_each_arrival(engine, arrivals, every_ask()):
        score = nvidia.plugin.kubegpu_scheduler_score(state, pod, ask)
        for mix in under_mixes(state):
            mask, reason = nvidia.eligible_gpus(state, ask)
            placed = None if reason else nvidia.place(state, mask, ask)
            assert score == (0.0 if placed is None else placed.score), (name, mix.mix())


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_a_placement_kept_across_mix_versions_is_the_placement_under_any_mix(
    arrivals: list[tuple[int, int]], policy: str
) -> None:
    # A placement no mix chose (`NvidiaPlacement.by_mix` false: one kind of room among the GPUs a share may take)
    # is kept across the mix's versions (`PlacementBook.steady`): through the book it is `place` under the mix of
    # now, and `place` gives it under another mix and under none; one the mix chose is placed again per version.
    engine = six_nodes(policy)
    for name, state, _, ask in asked_after_each_arrival(engine, arrivals, every_ask()):
        state._plan = None
        planned = state.plan(ask)
        mask, reason = nvidia.eligible_gpus(state, ask)
        fresh = None if reason else nvidia.place(state, mask, ask)
        assert planned == fresh, name
        if fresh is not None and fresh.by_mix:
            continue
        for mix in under_mixes(state, Workload.configured(OTHER_MIX), Workload()):
            assert (None if reason else nvidia.place(state, mask, ask)) == fresh, (name, mix.mix())
