"""The nvidia fit answers kept across the mix's versions (`PlacementBook.steady`) are the answers any mix gives.

A replay's mix of pods moves every few hundred placements (`sharing.Workload.version`), and each move dropped every
remembered placement and fit answer of every node (`PlacementBook`): the fgd policy ranks a share's GPUs by the mix.
Whether a node fits an ask reads only whether `place` finds GPUs, which the mix does not decide (it ranks only a lone
share container's GPUs, never which fit): those answers are kept, as the engine keeps them. The oracle here: nodes of
the openb trace's kinds take random pods, then every node's fit answer to every shape, through the book, is
`fit_answer` computed afresh under the learned mix, under a mix of other kinds, and under no mix at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import ContainerRequest, NodeInfo, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia.sharing import Workload
from kubegpu.scheduler import traces
from kubegpu.scheduler.engine import Engine

NODE_KINDS = [(96000, 393216, 8, "G2"), (16000, 122880, 2, "P100")]
SHAPES = [(0, 0), (1, 250), (1, 500), (1, 810), (1, 1000), (2, 1000), (4, 1000), (8, 1000)]
OTHER_MIX = ((1, 900, 1000, 5.0), (4, 1000, 32000, 1.0), (1, 100, 64000, 2.0))


def request(gpus: int, milli: int, name: str = "ask", cpu: int = 1000) -> PodRequest:
    return pod_request(traces.pod_document(traces.TracePod(name, cpu, 1024, gpus, milli, ()), name))[0]


def six_nodes(policy: str) -> Engine:
    """An engine with six nodes of `NODE_KINDS` in turn, their GPUs shared by `policy`."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for i in range(6):
        cpu, memory, gpus, model = NODE_KINDS[i % 2]
        engine.add_node(node_info(traces.node_document(traces.TraceNode(f"node-{i}", cpu, memory, gpus, model))))
    for name in engine.node_names():
        state = engine.nodes[name].states["nvidia"]
        assert isinstance(state, nvidia.NvidiaNodeState)
        state.policy = policy
    return engine


def asked_after_each_arrival(
    engine: Engine, arrivals: list[tuple[int, int]], asks: list[PodRequest]
) -> Iterator[tuple[str, nvidia.NvidiaNodeState, PodRequest, nvidia.NvidiaPodState]]:
    """After each arrival (at every version of the mix the arrivals move through), every node with every ask."""
    for i, (shape, cpu) in enumerate(arrivals):
        gpus, milli = SHAPES[shape]
        engine.schedule(request(gpus, milli, f"p{i}", cpu))
        for pod in asks:
            ask = nvidia.read_ask(pod)
            for name in engine.node_names():
                state = engine.nodes[name].states["nvidia"]
                assert isinstance(state, nvidia.NvidiaNodeState)
                yield name, state, pod, ask


def under_mixes(state: nvidia.NvidiaNodeState, *mixes: Workload) -> Iterator[Workload]:
    """The state's learned mix, a mix of other kinds and none (or `mixes`), each the state's in turn; the learned
    one put back."""
    learned = state.workload
    try:
        for mix in mixes or (learned, Workload.configured(OTHER_MIX), Workload()):
            state.workload = mix
            state._plan = None
            yield mix
    finally:
        state.workload = learned
        state._plan = None


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_a_fit_answer_kept_across_mix_versions_is_the_answer_under_any_mix(
    arrivals: list[tuple[int, int]], policy: str
) -> None:
    engine = six_nodes(policy)
    asks = [request(gpus, milli) for gpus, milli in SHAPES[1:]]
    for name, state, pod, ask in asked_after_each_arrival(engine, arrivals, asks):
        answer = nvidia.plugin.kubegpu_scheduler_fit(state, pod, ask)
        for mix in under_mixes(state):
            assert answer == nvidia.fit_answer(state, ask), (name, SHAPES, mix.mix())


TWO_SHARE_ASKS = [
    ({nvidia.RESOURCE: 1, "nvidia.com/gpucores": 30}, {nvidia.RESOURCE: 1, "nvidia.com/gpucores": 30}),
    ({nvidia.RESOURCE: 1, "nvidia.com/gpucores": 50}, {nvidia.RESOURCE: 1, "nvidia.com/gpucores": 90}),
    ({nvidia.RESOURCE: 2, "nvidia.com/gpucores": 40}, {nvidia.RESOURCE: 1, "nvidia.com/gpumem-percentage": 70}),
]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_no_mix_decides_where_a_pod_of_two_share_containers_goes(arrivals: list[tuple[int, int]], policy: str) -> None:
    # Where the first share goes decides whether the second finds room: by the mix, whether the pod fits a node
    # would move with the mix, which the engine's memos of a node's fit answer do not follow. The oracle is `place`
    # itself under the learned mix, a mix of other kinds and none, on nodes of random fill.
    engine = six_nodes(policy)
    asks = [
        nvidia.parse_ask([ContainerRequest("a", first), ContainerRequest("b", second)], {})
        for first, second in TWO_SHARE_ASKS
    ]
    for i, (shape, cpu) in enumerate(arrivals):
        gpus, milli = SHAPES[shape]
        engine.schedule(request(gpus, milli, f"p{i}", cpu))
        for ask in asks:
            assert len(ask.shares) == 2 and not ask.error
            for name in engine.node_names():
                state = engine.nodes[name].states["nvidia"]
                assert isinstance(state, nvidia.NvidiaNodeState)
                mask, _ = nvidia.eligible_gpus(state, ask)
                placements = [nvidia.place(state, mask, ask) for _ in under_mixes(state)]
                assert placements[0] == placements[1] == placements[2], (name, state.workload.mix())
                assert placements[0] is None or not placements[0].by_mix


SHARE_ASKS = [
    {nvidia.RESOURCE: 1, "nvidia.com/gpucores": 30},
    {nvidia.RESOURCE: 1, "nvidia.com/gpucores": 70, "nvidia.com/gpumem-percentage": 20},
    {nvidia.RESOURCE: 2, "nvidia.com/gpucores": 50},
    {nvidia.RESOURCE: 1, "nvidia.com/gpumem": 9000},
    {nvidia.RESOURCE: 3, "nvidia.com/gpumem-percentage": 60},
]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.sampled_from([1000, 8000, 32000])), max_size=40),
    st.sampled_from(["fgd", "bestfit"]),
)
def test_a_share_fits_where_place_finds_it_gpus(arrivals: list[tuple[int, int]], policy: str) -> None:
    # A fit answer of one share container asks whether enough GPUs have room for it (`shares_fit`), without
    # placing it by the mix: the oracle is `place` itself, on nodes of random fill, for shares of compute, of
    # memory, and of several GPUs.
    engine = six_nodes(policy)
    asks = [nvidia.parse_ask([ContainerRequest("main", resources)], {}) for resources in SHARE_ASKS]
    for i, (shape, cpu) in enumerate(arrivals):
        gpus, milli = SHAPES[shape]
        engine.schedule(request(gpus, milli, f"p{i}", cpu))
    for ask in asks:
        assert len(ask.shares) == 1 and not ask.containers and not ask.error
        for name in engine.node_names():
            state = engine.nodes[name].states["nvidia"]
            assert isinstance(state, nvidia.NvidiaNodeState)
            mask, _ = nvidia.eligible_gpus(state, ask)
            assert nvidia.shares_fit(state, mask, ask) == (nvidia.place(state, mask, ask) is not None)


def test_a_pod_of_two_share_containers_is_answered_as_the_node_places_it_under_the_mix_now() -> None:
    # The engine keeps a node's fit answer per node content, across the moves of the learned mix (`check`'s memo,
    # the shape's answers), so the answer must not read the mix. Here GPU 0 of the node in pool a holds 40 %; a pod
    # asks 50 % in one container and 90 % in another: where the first share goes decides whether the second finds
    # room. Whatever the mix has learned, the pod is bound or refused as `place` answers on the node now.
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    engine.add_node(hami_node("gpu-a", 2, "a"))
    engine.add_node(hami_node("gpu-b", 8, "b"))
    assert engine.schedule(share_pod("filler", "a", main=(40, 40))).node == "gpu-a"
    state = engine.nodes["gpu-a"].states["nvidia"]
    assert isinstance(state, nvidia.NvidiaNodeState)
    two = nvidia.read_ask(share_pod("two", "a", first=(50, 50), second=(90, 50)))

    def placed_now() -> bool:
        mask, _ = nvidia.eligible_gpus(state, two)
        return nvidia.place(state, mask, two) is not None

    fits = placed_now()
    first = engine.schedule(share_pod("two-0", "a", first=(50, 50), second=(90, 50)))
    assert first.scheduled == fits, (first.reason, state.workload.mix())
    if first.scheduled:
        engine.release(first.pod)
    # Pods of 70 % come and go on the other pool until the learned mix moves; the node in pool a stays as it was.
    version, n = state.workload.version, 0
    while state.workload.version == version:
        decision = engine.schedule(share_pod(f"seventy-{n}", "b", main=(70, 70)))
        assert decision.scheduled, decision.reason
        engine.release(decision.pod)
        n += 1
    fits = placed_now()
    again = engine.schedule(share_pod("two-1", "a", first=(50, 50), second=(90, 50)))
    assert again.scheduled == fits, (again.reason, state.workload.mix())
    assert again.scheduled and again.node == "gpu-a", again.reason


def hami_node(name: str, gpus: int, pool: str) -> NodeInfo:
    """A node of `gpus` 16 GiB GPUs shared as HAMi's device plugin advertises them, labelled pool=`pool`."""
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "16384", "pool": pool}
    allocatable = {
        nvidia.RESOURCE: 10 * gpus,
        "nvidia.com/gpucores": 100 * gpus,
        "nvidia.com/gpumem": 16384 * gpus,
        "nvidia.com/gpumem-percentage": 100 * gpus,
        "cpu": 64000,
        "pods": 1000,
    }
    return make_node(name, labels=labels, allocatable=allocatable)


def share_pod(name: str, pool: str, **containers: tuple[int, int]) -> PodRequest:
    """A pod for pool `pool` whose containers each ask one GPU's (compute %, memory %)."""
    resources = {
        container: {nvidia.RESOURCE: 1, "nvidia.com/gpucores": cores, "nvidia.com/gpumem-percentage": memory}
        for container, (cores, memory) in containers.items()
    }
    return make_pod(name, resources, node_selector={"pool": pool})
