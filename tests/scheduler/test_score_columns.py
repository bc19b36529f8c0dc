"""The engine's per-cycle shortcuts over many nodes, each held equal to the one-node function it replaces: the
spread filter's judge (`filters.spread_judge` vs `spread_fits`), and the score columns (`scores.affinity_raws` vs
`affinity_raw`, `scores.spread_raws` vs `spread_raw`). A cycle calls them for every node it visits, so they are
written for speed; these oracles keep them right."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.models import LabelSelector, PodRequest, Requirement, SpreadConstraint
from kubegpu.scheduler import filters, scores

KEYS = ["topology.kubernetes.io/zone", scores.HOSTNAME, "rack"]
VALUES = ["", "a", "b", "c"]

labels_strategy = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
nodes_strategy = st.lists(labels_strategy, min_size=1, max_size=12).map(
    lambda many: [(f"n{i}", {**labels, **({scores.HOSTNAME: f"n{i}"} if scores.HOSTNAME in labels else {})})
                  for i, labels in enumerate(many)]
)  # fmt: skip
constraint_strategy = st.builds(
    SpreadConstraint,
    max_skew=st.integers(1, 3),
    topology_key=st.sampled_from(KEYS),
    when_unsatisfiable=st.just("ScheduleAnyway"),
    selector=st.just(LabelSelector((Requirement("app", "In", ("x",)),))),
)


def hard(constraint: SpreadConstraint) -> SpreadConstraint:
    return SpreadConstraint(constraint.max_skew, constraint.topology_key, "DoNotSchedule", constraint.selector)


POD = PodRequest(namespace="ns", name="p", uid="u", containers=(), labels={"app": "x"})


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), st.integers(-100, 100), max_size=8),
    nodes_strategy,
)
def test_affinity_columns_equal_the_per_node_score(table: dict[tuple[str, str], int], nodes: list) -> None:  # type: ignore[type-arg]
    labels = [node_labels for _, node_labels in nodes]
    assert scores.affinity_raws(table, labels) == [scores.affinity_raw(table, node_labels) for node_labels in labels]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(constraint_strategy, min_size=1, max_size=3),
    nodes_strategy,
    st.dictionaries(st.sampled_from([f"n{i}" for i in range(12)]), st.integers(0, 5)),
    st.data(),
)
def test_spread_columns_equal_the_per_node_score(constraints: list, nodes: list, placed: dict, data) -> None:  # type: ignore[no-untyped-def, type-arg]
    # The state the engine's PreScore makes: counts for the feasible nodes' pairs, hosts for hostname constraints.
    state = scores.spread_prescore(POD, nodes, (), constraints)
    assert state is not None
    for pair in state.counts:
        state.counts[pair] = data.draw(st.integers(0, 6))
    state.hosts = tuple(placed if c.topology_key == scores.HOSTNAME else None for c in state.constraints)
    expected = [scores.spread_raw(state, POD, name, labels) for name, labels in nodes]
    assert scores.spread_raws(state, POD, nodes) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(constraint_strategy.map(hard), min_size=1, max_size=3),
    st.lists(st.dictionaries(st.sampled_from(VALUES), st.integers(0, 6), max_size=4), min_size=3, max_size=3),
    st.lists(st.integers(0, 3), min_size=3, max_size=3),
    st.lists(st.integers(0, 1), min_size=3, max_size=3),
    labels_strategy,
)  # fmt: skip
def test_the_spread_judge_equals_the_spread_filter(constraints, counts, minimum, own, labels) -> None:  # type: ignore[no-untyped-def]
    n = len(constraints)
    state = filters.SpreadState(tuple(constraints), tuple(counts[:n]), tuple(minimum[:n]), tuple(own[:n]))
    assert filters.spread_judge(state)(labels) == filters.spread_fits(POD, state, labels)
