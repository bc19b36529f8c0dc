"""Expected fragmentation of whole devices (`kubegpu.core.kit`): the mix of request sizes an engine learns, the
chance that the next container is turned away, and what the engine does with it. The kit gives it to every
whole-device plugin (a third party's included); the neuron plugin measures it on its rings and tori."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.kit import (
    TURNED_AWAY_WEIGHT,
    SizeMix,
    WholeDeviceNodeState,
    WholeDevicePlugin,
    fragmentation_growth,
    label_devices,
    turned_away,
    turned_away_growth,
)
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import DeviceInfo, NodeInfo
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.neuron import topology as topo
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.engine.scoring import Scoring

CARD = "cards.example/card"
TOPOLOGIES = [
    topo.make_topology("ring", 6),
    topo.make_topology("ring", 12),
    topo.make_topology("torus", 16, 4, 4),
]


class Cards(WholeDevicePlugin):
    """Interchangeable cards from the label `cards.example/card.count`: the kit's defaults throughout."""

    resources = (CARD,)

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
        return label_devices(node.labels, f"{CARD}.count", "card"), None


def node_document(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, object]:
    status = {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", **allocatable}}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": status}


def pod_document(name: str, resource: str, count: int, node: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "main", "resources": {"limits": {resource: str(count)}}}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec}


def schedule(engine: Engine, name: str, resource: str, count: int, node: str | None = None) -> str | None:
    return engine.schedule(pod_request(pod_document(name, resource, count, node))[0]).node


def learn(engine: Engine, resource: str, sizes: Sequence[int]) -> None:
    """Place pods of these sizes and let them go again: the engine's mix has seen them, its nodes are as before."""
    for i, size in enumerate(sizes):
        assert schedule(engine, f"seen-{i}", resource, size) is not None
        assert engine.release(f"team/seen-{i}") is not None


# ---------------------------------------------------------------------------------------------------------------
# The mix
# ---------------------------------------------------------------------------------------------------------------


def test_the_mix_is_the_share_of_each_size_seen() -> None:
    mix = SizeMix(memory=1e12)  # no fading to speak of
    assert mix.mix() == () and mix.mean() == 0.0
    for size in (1, 1, 1, 4):
        mix.add(size)
    assert dict(mix.mix()) == pytest.approx({1: 0.75, 4: 0.25})
    assert mix.mean() == pytest.approx(1.75)


def test_the_mix_follows_the_recent_workload() -> None:
    """A thousand 16-device pods, then a thousand single devices: the singles are most of what the mix expects."""
    mix = SizeMix(memory=200)
    for _ in range(1000):
        mix.add(16)
    for _ in range(1000):
        mix.add(1)
    shares = dict(mix.mix())
    assert shares[1] > 0.99


def test_the_mix_keeps_a_bounded_number_of_sizes() -> None:
    mix = SizeMix(most=4)
    for size in range(1, 100):
        mix.add(size)
    assert len(mix.mix()) == 4
    assert sum(p for _, p in mix.mix()) == pytest.approx(1.0)


def test_the_weights_of_a_long_history_stay_finite() -> None:
    mix = SizeMix(memory=2)  # each container weighs 1.5 times the one before: rescaled every ~570
    for i in range(5000):
        mix.add(1 + i % 3)
    assert sum(p for _, p in mix.mix()) == pytest.approx(1.0)
    assert all(0 < p < 1 for _, p in mix.mix())


def test_the_published_mix_follows_the_learned_one_within_its_drift() -> None:
    """With a drift, the mix the measure reads is republished only once the learned one has moved that far (total
    variation distance): the first container publishes at once, a settled mix stays put for a while, a new workload
    is followed."""
    mix = SizeMix(memory=1e12, drift=0.05)
    mix.add(2)
    assert (mix.version, mix.mix()) == (1, ((2, 1.0),))
    for _ in range(99):
        mix.add(2)
    mix.add(4)  # 1 in 101: the learned mix moved by 0.01
    assert mix.version == 1 and mix.mix() == ((2, 1.0),)
    for _ in range(10):
        mix.add(4)
    assert mix.version == 2
    assert dict(mix.mix()) == pytest.approx({2: 100 / 111, 4: 11 / 111}, abs=0.05)
    exact = SizeMix(memory=1e12)
    for size in (2, 2, 4):
        exact.add(size)
    assert exact.version == 3  # no drift: every container publishes


@given(sizes=st.lists(st.integers(1, 6), max_size=60), drift=st.sampled_from([0.0, 0.02, 0.2]))
def test_the_distance_to_the_published_mix_is_the_total_variation_distance(sizes: list[int], drift: float) -> None:
    # The oracle of `SizeMix._moved`, which reads the published mix from a dict kept at publication: half the summed
    # differences of the learned and the published probabilities, sizes pushed out (`most` 3) included.
    mix = SizeMix(memory=20, most=3, drift=drift)
    for size in sizes:
        mix.add(size)
        learned = {size: weight / mix.total for size, weight in mix.weights.items()}
        published = dict(mix.mix())
        every = learned.keys() | published.keys()
        expected = sum(abs(learned.get(k, 0.0) - published.get(k, 0.0)) for k in every) / 2
        assert mix._moved() == pytest.approx(expected, abs=1e-12)


class EveryAddMeasures(SizeMix):
    """The oracle of `SizeMix.add`'s bound (`_slack`): the mix as it learned before the bound, measuring the
    distance to the published mix after every container."""

    def add(self, size: int) -> None:
        if size < 1:
            return
        if size not in self.weights and len(self.weights) >= self.most:
            rarest = min(self.weights, key=self.weights.__getitem__)
            self.total -= self.weights.pop(rarest)
        self.weights[size] = self.weights.get(size, 0.0) + self._next
        self.total += self._next
        self._next *= self.growth
        if self._next > 1e100:
            for known in self.weights:
                self.weights[known] /= 1e100
            self.total /= 1e100
            self._next /= 1e100
        if not self._mix or self.drift <= 0 or self._moved() > self.drift:
            self._publish()


@settings(max_examples=300)
@given(
    sizes=st.lists(st.integers(0, 9), max_size=400)
    | st.lists(st.sampled_from([1, 1, 1, 1, 2, 8]), min_size=200, max_size=1500),
    memory=st.sampled_from([1.0, 3.0, 50.0, 1000.0]),
    most=st.integers(2, 64),
    drift=st.sampled_from([0.0, 0.001, 0.02, 0.05, 0.2]),
)
def test_the_mix_publishes_as_when_every_container_measured_the_distance(
    sizes: list[int], memory: float, most: int, drift: float
) -> None:
    """`add` measures the distance only once its bound may pass the drift: the same mixes are published, with the
    same versions, after the same containers (weights scaled down at memory 1, sizes pushed out, settled mixes)."""
    mix, oracle = (
        SizeMix(memory=memory, most=most, drift=drift),
        EveryAddMeasures(memory=memory, most=most, drift=drift),
    )
    for size in sizes:
        mix.add(size)
        oracle.add(size)
        assert (mix.version, mix.mix(), mix.mean()) == (oracle.version, oracle.mix(), oracle.mean())


def test_a_settled_mix_of_one_size_is_not_measured_again() -> None:
    """Every container asking the one size published cannot move the mix: `add` does not measure the distance."""
    mix = SizeMix(drift=0.02)
    mix.add(1)
    measured = 0

    def counted() -> float:
        nonlocal measured
        measured += 1
        return 0.0

    mix._moved = counted  # type: ignore[method-assign]
    for _ in range(5000):
        mix.add(1)
    assert (measured, mix.version) == (0, 1)


# ---------------------------------------------------------------------------------------------------------------
# The measure, against its definition computed kind by kind
# ---------------------------------------------------------------------------------------------------------------


def turned_away_by_definition(topology: topo.Topology, free: int, mix: Sequence[tuple[int, float]]) -> float:
    """For each size, is one of the topology's valid sets of that size all free? The sizes with none add up."""
    chance = 0.0
    for size, p in mix:
        if not any(free & block == block for block in topo.valid_sets(topology, size)):
            chance += p
    return chance


mixes = st.lists(
    st.tuples(st.integers(1, 17), st.floats(0.001, 1.0)), min_size=1, max_size=9, unique_by=lambda pair: pair[0]
).map(lambda pairs: tuple((size, w / sum(w for _, w in pairs)) for size, w in pairs))


@given(st.sampled_from(TOPOLOGIES), st.integers(0, (1 << 16) - 1), st.integers(0, (1 << 16) - 1), mixes)
def test_turned_away_is_the_chance_of_sizes_without_a_free_valid_set(
    topology: topo.Topology, free: int, taken: int, mix: tuple[tuple[int, float], ...]
) -> None:
    free &= (1 << topology.devices) - 1
    after = free & ~taken

    def fits(devices: int, size: int) -> bool:
        return topo.has_free_set(topology, devices, size)

    assert turned_away(free, mix, fits) == pytest.approx(turned_away_by_definition(topology, free, mix))
    grown = turned_away_growth(free, after, mix, fits)
    assert grown >= 0.0
    assert grown == pytest.approx(
        turned_away_by_definition(topology, after, mix) - turned_away_by_definition(topology, free, mix)
    )


@given(st.sampled_from(TOPOLOGIES), st.integers(0, (1 << 16) - 1), st.integers(0, 17))
def test_has_free_set_is_some_valid_set_all_free(topology: topo.Topology, free: int, size: int) -> None:
    free &= (1 << topology.devices) - 1
    expected = any(free & block == block for block in topo.valid_sets(topology, size))
    assert topo.has_free_set(topology, free, size) is expected


def test_the_growth_in_devices_weighs_the_mean_request() -> None:
    """Four free interchangeable cards, a mix of pairs (3/4) and quads (1/4): taking one card turns the quads away,
    a quarter of the mix; in devices, twice the mean request (2.5) of that."""
    mix = SizeMix(memory=1e12)
    for size in (2, 2, 2, 4):
        mix.add(size)

    def fits(free: int, size: int) -> bool:
        return free.bit_count() >= size

    assert fragmentation_growth(0b1111, 0b1110, mix, fits) == pytest.approx(0.25 * TURNED_AWAY_WEIGHT * 2.5)
    assert fragmentation_growth(0b1111, 0b1111, mix, fits) == 0.0
    assert fragmentation_growth(0b1111, 0b1110, SizeMix(), fits) == 0.0  # nothing seen: nothing to expect


# ---------------------------------------------------------------------------------------------------------------
# What the engine does with it
# ---------------------------------------------------------------------------------------------------------------


def cards_engine() -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("cards", Cards())], autoload=False))
    for name in ("busy", "empty"):
        engine.add_node(node_info(node_document(name, {f"{CARD}.count": "8"}, {CARD: "8"})))
    return engine


def test_a_learned_small_pod_mix_stops_reserving_the_empty_node() -> None:
    """Pairs are what come. Binpack alone puts a single card on the busy node and leaves it one card: no pair fits
    there any more. Breaking into the empty node turns nothing away, so the single goes there."""
    engine = cards_engine()
    learn(engine, CARD, [2] * 10)
    assert schedule(engine, "holder", CARD, 6, node="busy") == "busy"
    assert schedule(engine, "single", CARD, 1) == "empty"


def test_a_learned_big_pod_mix_keeps_the_empty_node_whole() -> None:
    """Whole nodes are what come: the single goes beside the holder, where no 8-card pod fits anyway, and the
    next 8-card pod finds the empty node whole."""
    engine = cards_engine()
    learn(engine, CARD, [8] * 10)
    assert schedule(engine, "holder", CARD, 6, node="busy") == "busy"
    assert schedule(engine, "single", CARD, 1) == "busy"
    assert schedule(engine, "whole", CARD, 8) == "empty"


def neuron_engine() -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    for name, kind in (("inf2-small", "inf2.24xlarge"), ("trn1-big", "trn1.32xlarge")):
        devices = str(topo.CATALOG[kind].devices)
        labels = {"node.kubernetes.io/instance-type": kind}
        engine.add_node(node_info(node_document(name, labels, {neuron.NEURON: devices})))
    return engine


@pytest.mark.parametrize(
    ("seen", "expected"),
    [([2] * 12, "trn1-big"), ([16, 1] * 6, "inf2-small")],
    ids=["pairs-come-break-the-torus", "whole-tori-come-keep-it"],
)
def test_neuron_reserves_the_empty_torus_only_when_whole_torus_pods_come(seen: list[int], expected: str) -> None:
    """The 6-device ring has its last two devices free. A single device there leaves no pair of neighbours: when
    pairs are what comes, it goes to the empty 4x4 torus instead (which takes no pairs at all, so nothing is turned
    away). When 16-device pods come, the torus is kept whole for them and the single takes the ring's gap."""
    engine = neuron_engine()
    learn(engine, neuron.NEURON, seen)
    assert schedule(engine, "holder", neuron.NEURON, 4, node="inf2-small") == "inf2-small"
    assert schedule(engine, "single", neuron.NEURON, 1) == expected


def test_each_engine_learns_its_own_mix() -> None:
    """Two engines in one process: what one has seen does not move the other's pods."""
    pairs, wholes = cards_engine(), cards_engine()
    learn(pairs, CARD, [2] * 10)
    learn(wholes, CARD, [8] * 10)
    for engine in (pairs, wholes):
        busy, empty = (engine.nodes[name].states["cards"] for name in ("busy", "empty"))
        assert isinstance(busy, WholeDeviceNodeState) and isinstance(empty, WholeDeviceNodeState)
        assert busy.mix is empty.mix  # the nodes of one engine learn one mix
        assert schedule(engine, "holder", CARD, 6, node="busy") == "busy"
    assert schedule(pairs, "single", CARD, 1) == "empty"
    assert schedule(wholes, "single", CARD, 1) == "busy"


def test_a_node_nothing_changed_on_is_measured_again_once_the_mix_moves_on() -> None:
    """The kit's plugins too: while 8-card pods come, a single card goes beside the 6-card holder and keeps the empty
    node whole; once pairs are most of what comes (placed on a third node, so the first two are as they were), it
    goes to the empty node, where it turns no pair away."""
    engine = cards_engine()
    engine.add_node(node_info(node_document("pairs", {f"{CARD}.count": "2"}, {CARD: "2"})))
    learn(engine, CARD, [8] * 10)
    assert schedule(engine, "holder", CARD, 6, node="busy") == "busy"
    single = pod_request(pod_document("single", CARD, 1))[0]
    assert engine.decide(single).node == "busy"
    for i in range(40):
        assert schedule(engine, f"pair-{i}", CARD, 2, node="pairs") == "pairs"
        assert engine.release(f"team/pair-{i}") is not None
    assert schedule(engine, "kept", CARD, 2, node="pairs") == "pairs"  # the third node full
    assert engine.decide(single).node == "empty"


def test_neuron_measures_a_node_nothing_changed_on_again_once_the_mix_moves_on() -> None:
    """The engine remembers a node's scores until the node changes or its plugins' mix moves on
    (`kubegpu_scheduler_fragmentation_epoch`). While 16-device pods come, a single device takes the ring's gap and
    keeps the torus whole; once pairs are most of what comes (placed on a third node, so the ring and the torus are
    as they were), the same single goes to the torus: on the ring it would leave no pair of neighbours."""
    engine = neuron_engine()
    labels = {"node.kubernetes.io/instance-type": "inf2.48xlarge"}
    engine.add_node(node_info(node_document("inf2-pairs", labels, {neuron.NEURON: "12"})))
    learn(engine, neuron.NEURON, [16, 1] * 6)
    assert schedule(engine, "holder", neuron.NEURON, 4, node="inf2-small") == "inf2-small"
    single = pod_request(pod_document("single", neuron.NEURON, 1))[0]
    assert engine.decide(single).node == "inf2-small"
    for i in range(30):
        assert schedule(engine, f"pair-{i}", neuron.NEURON, 2, node="inf2-pairs") == "inf2-pairs"
        assert engine.release(f"team/pair-{i}") is not None
    for i in range(6):  # the third node full: the single has the ring and the torus to choose from
        assert schedule(engine, f"kept-{i}", neuron.NEURON, 2, node="inf2-pairs") == "inf2-pairs"
    assert engine.decide(single).node == "trn1-big"


# ---------------------------------------------------------------------------------------------------------------
# Nodes alike share one computation of their scores (`WholeDeviceNodeState.scoring_content`)
# ---------------------------------------------------------------------------------------------------------------


class RingCards(Cards):
    """Cards on a ring (`extra`): a set is valid when contiguous, so which cards are free matters."""

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], object] | None:
        found = label_devices(node.labels, f"{CARD}.count", "card")
        return found, topo.make_topology("ring", len(found))

    def choose(self, state: WholeDeviceNodeState, free: int, count: int, request: object) -> int | None:
        return topo.choose_devices(state.extra, 1, free, free, count)

    def fits(self, state: WholeDeviceNodeState, free: int, count: int) -> bool:
        return topo.has_free_set(state.extra, free, count)


def kit_placements(plugin: WholeDevicePlugin, arrivals: list[tuple[int, int]], percentage: int) -> list[str | None]:
    """Where an engine of 9 card nodes (4, 6 or 8 cards) places pods of `arrivals` (cards asked, and when the
    second number is below 3 an earlier pod leaves first)."""
    profile = dataclasses.replace(scores.Profile.default("binpack"), percentage_of_nodes_to_score=percentage)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("cards", plugin)], autoload=False), scoring=profile)
    for i in range(9):
        count = str(4 + 2 * (i % 3))
        engine.add_node(node_info(node_document(f"n{i}", {f"{CARD}.count": count}, {CARD: count})))
    placed: list[str | None] = []
    for n, (size, leave) in enumerate(arrivals):
        if leave < 3 and placed:
            engine.release(f"team/p{(n * 7 + leave) % len(placed)}")
        placed.append(schedule(engine, f"p{n}", CARD, size))
    return placed


@settings(max_examples=20, deadline=None)
@given(
    plugin=st.sampled_from([Cards, RingCards]),
    arrivals=st.lists(st.tuples(st.sampled_from([1, 1, 2, 3, 4, 8]), st.integers(0, 9)), min_size=1, max_size=50),
    percentage=st.sampled_from([100, 0]),
)
def test_nodes_alike_in_the_kits_scoring_content_score_alike(
    plugin: type[WholeDevicePlugin], arrivals: list[tuple[int, int]], percentage: int
) -> None:
    # The oracle of the kit's `scoring_content`: the engine's scores shared by nodes alike in it
    # (`LocalRaws.by_number`) place every pod where scoring each node alone does, departures and a moving mix included.
    fast = kit_placements(plugin(), arrivals, percentage)
    original = Scoring.scoring_content
    try:
        Scoring.scoring_content = lambda self, record: None  # type: ignore[method-assign]
        slow = kit_placements(plugin(), arrivals, percentage)
    finally:
        Scoring.scoring_content = original  # type: ignore[method-assign]
    assert fast == slow


def test_the_kits_scoring_content_follows_the_free_cards_and_the_mix() -> None:
    mix = SizeMix()
    devices = [DeviceInfo(id=str(i)) for i in range(4)]
    a = WholeDeviceNodeState("cards", "a", devices, None, mix)
    b = WholeDeviceNodeState("cards", "b", devices, None, mix)
    assert a.scoring_content() == b.scoring_content()  # the node's name is not read
    b.hold([0], "team/p")
    assert a.scoring_content() != b.scoring_content()
    before = a.scoring_content()
    mix.add(2)
    assert a.scoring_content() != before
    unhashable = WholeDeviceNodeState("cards", "c", devices, {"rows": 2}, mix)
    assert unhashable.scoring_content() == (unhashable,)  # scored alone


@pytest.mark.parametrize("fragmentation", [True, False], ids=["fragmentation-scored", "fragmentation-off"])
def test_a_remembered_neuron_score_follows_the_learned_mix(fragmentation: bool) -> None:
    """The neuron plugin's device score discounts a placement by the sizes of the learned mix it would turn away, so
    a node's remembered score (the extender's prioritize, `Engine.score_node`; a cycle's local raw scores) holds only
    while that mix does, with KubegpuFragmentation scored or turned off in the profile: after the mix moves on, the
    remembered answers equal an engine's that forgot its memos."""
    default = scores.Profile.default()
    weights = dict(default.weights) if fragmentation else {**default.weights, scores.FRAGMENTATION: 0}
    engine = Engine(
        make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False), scoring=scores.Profile(weights)
    )
    for name, kind in (("inf2-small", "inf2.24xlarge"), ("trn1-big", "trn1.32xlarge"), ("inf2-pairs", "inf2.48xlarge")):
        labels = {"node.kubernetes.io/instance-type": kind}
        engine.add_node(node_info(node_document(name, labels, {neuron.NEURON: str(topo.CATALOG[kind].devices)})))
    learn(engine, neuron.NEURON, [16, 1] * 6)
    assert schedule(engine, "holder", neuron.NEURON, 4, node="inf2-small") == "inf2-small"
    single = pod_request(pod_document("single", neuron.NEURON, 1))[0]
    nodes = ("inf2-small", "trn1-big")
    before = {name: engine.score_node(name, single) for name in nodes}

    def local_raws() -> list[tuple[float, ...]]:  # a cycle's local raw scores, remembered per pod shape
        return engine._local_raw(list(nodes), [engine.nodes[name] for name in nodes], single, engine.plan(single))

    def sampled_raws() -> list[tuple[float, ...]]:  # the same per content, as a sampled cycle ranks them
        found = engine._local_by_content(list(nodes), single, engine.plan(single))
        assert found is not None
        numbered, first, raws = found
        return [dict(zip(first, raws, strict=True))[number] for number in numbered]

    sampled_before = sampled_raws()  # remembered under the mix before: its scores that read no mix are kept
    local_before = local_raws()
    for i in range(30):  # pairs on the third node: the first two are as they were, the mix is not
        assert schedule(engine, f"pair-{i}", neuron.NEURON, 2, node="inf2-pairs") == "inf2-pairs"
        assert engine.release(f"team/pair-{i}") is not None
    remembered = {name: engine.score_node(name, single) for name in nodes}
    sampled_remembered = sampled_raws()  # first: the shape's raw scores under the mix now are made here
    local_remembered = local_raws()
    engine.forget_memos()
    fresh = {name: engine.score_node(name, single) for name in nodes}
    assert fresh != before  # the mix moved the score: the memo had something to get wrong
    assert remembered == fresh
    local_fresh = local_raws()
    assert local_fresh != local_before
    assert local_remembered == local_fresh
    assert sampled_before == local_before and sampled_remembered == local_fresh
