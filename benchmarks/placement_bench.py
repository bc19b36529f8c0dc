"""Benchmark: placement quality of kubegpu against naive first-fit, on Neuron rings and tori.

Both place the same pods in arrival order on the same nodes (trn1.32xlarge 4x4 tori and inf2.48xlarge / inf2.24xlarge
rings). First-fit takes the first node, in node order, with a valid free device set of the requested size, and the
lowest such set; kubegpu is the real engine with the neuron plugin (binpack policy). For each workload it prints pods
placed and stranded devices (free devices outside the largest request their node could still take) for both, side by
side; in the first table no pod leaves:

* `issue-example`: one trn1 and one inf2, pods of 4, 8, 1, 3, 2 and 4 devices;
* `random-N`: sizes drawn uniformly from every size some node takes;
* `fragmenting-N`: torus-and-ring sizes (4, 8) and ring-only sizes (2, 3, 5, 6) interleaved on rings listed before
  tori, the mix where a greedy choice of node spends ring capacity on sizes a torus would take;
* `departures-N` (a second table): 12 nodes of random types and 400 pods of the random sizes, arriving one per step;
  each leaves after a lifetime of its own (exponential, mean 300 steps, placed or not: the lifetime belongs to the
  workload, as in a trace), so about 30 % of the events are departures. Besides pods placed it prints
  device-steps (the devices held, summed over the events: GPU-hours in the small), the pods of 12 or 16 devices
  placed (the whole-node pods only an empty inf2.48xlarge or trn1.32xlarge takes) and the stranded devices at the end.

`--first-mix N` starts the departures mixes at departures-N (a check that a change holds beyond the mixes it was
studied on); `--references` adds online rules that are not kubegpu's (`loosest_replay`, `emptiest_replay`,
`same_node_replay`, `guarded_replay`; `--loosest` is `--references loosest`) and `--lookahead` an oracle that sees
the coming events. `--references one-change` is no rule but the floor of every rule that differs from first-fit
(`one_change`): first-fit with one arrival sent to another node that fits, each in turn, and how often that single
change ends below first-fit, on the mix's own events and on futures drawn from what the scheduler knows.

    .venv/bin/python benchmarks/placement_bench.py [--seeds 10] [--departure-mixes 30] [--first-mix 30]
        [--references loosest emptiest same-node guarded one-change] [--lookahead 150]
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.neuron import topology as topo
from kubegpu.scheduler.engine import Engine

RESOURCE = neuron.NEURON
SHAPES = {"trn1.32xlarge": 16, "inf2.48xlarge": 12, "inf2.24xlarge": 6}
RANDOM_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # every size some node takes


# A workload event: ("arrive", pod index, devices) or ("leave", pod index, 0).
Event = tuple[str, int, int]
LARGE = 12  # pods of at least this many devices take a whole inf2.48xlarge or trn1.32xlarge
WIDTHS = (10, 10, 13, 13, 8, 8, 10, 10)  # the departures table's columns after the first two


@dataclass(frozen=True)
class Result:
    placed: int
    stranded: int
    busy: int = 0  # devices held, summed over the events
    large: int = 0  # pods of LARGE devices or more placed


def node_document(name: str, kind: str) -> dict[str, object]:
    devices = SHAPES[kind]
    allocatable = {
        "cpu": "192",
        "memory": "1Ti",
        "pods": "250",
        neuron.NEURON: str(devices),
        neuron.NEURONDEVICE: str(devices),
    }
    labels = {"node.kubernetes.io/instance-type": kind}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod_document(name: str, size: int) -> dict[str, object]:
    container = {"name": "main", "resources": {"limits": {RESOURCE: str(size)}}}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "bench"}, "spec": {"containers": [container]}}


def topology_of(kind: str) -> topo.Topology:
    shape = topo.CATALOG[kind]
    return topo.make_topology(shape.kind, shape.devices, shape.rows, shape.columns)


def arrivals(sizes: list[int]) -> list[Event]:
    return [("arrive", i, size) for i, size in enumerate(sizes)]


def first_fit(nodes: list[tuple[str, str]], sizes: list[int]) -> Result:
    return first_fit_replay(nodes, arrivals(sizes))


def kubegpu(nodes: list[tuple[str, str]], sizes: list[int]) -> Result:
    return kubegpu_replay(nodes, arrivals(sizes))


# A rule of where an arriving pod goes: (its step in the events, its size, the free devices per node, the pods held)
# -> (node, the devices it takes), or None to refuse it.
Rule = Callable[[int, int, dict[str, int], dict[int, tuple[str, int]]], "tuple[str, int] | None"]


def replay(nodes: list[tuple[str, str]], events: list[Event], rule: Rule) -> Result:
    """The events on empty nodes, each arrival placed where `rule` says: pods placed, devices stranded at the end,
    device-steps held and pods of at least `LARGE` devices placed."""
    free = {name: (1 << SHAPES[kind]) - 1 for name, kind in nodes}
    shapes = {name: topology_of(kind) for name, kind in nodes}
    held: dict[int, tuple[str, int]] = {}
    placed = busy = large = 0
    for step, (what, pod, size) in enumerate(events):
        if what == "leave":
            if pod in held:
                name, block = held.pop(pod)
                free[name] |= block
        elif (chosen := rule(step, size, free, held)) is not None:
            name, block = chosen
            free[name] &= ~block
            held[pod] = (name, block)
            placed += 1
            large += size >= LARGE
        busy += sum(block.bit_count() for _, block in held.values())
    stranded = sum(free[n].bit_count() - topo.largest_device_set(shapes[n], free[n]) for n, _ in nodes)
    return Result(placed, stranded, busy, large)


def lowest_set(shape: topo.Topology, free: int, size: int) -> int | None:
    """First-fit's choice on one node: its lowest valid set of `size` free devices."""
    return next((b for b in topo.valid_sets(shape, size) if free & b == b), None)


def first_fit_rule(nodes: list[tuple[str, str]], shapes: dict[str, topo.Topology]) -> Rule:
    """The first node in order with a valid set free, its lowest one."""

    def rule(step: int, size: int, free: dict[str, int], held: dict[int, tuple[str, int]]) -> tuple[str, int] | None:
        for name, _ in nodes:
            if (block := lowest_set(shapes[name], free[name], size)) is not None:
                return name, block
        return None

    return rule


def shapes_of(nodes: list[tuple[str, str]]) -> dict[str, topo.Topology]:
    return {name: topology_of(kind) for name, kind in nodes}


def first_fit_replay(nodes: list[tuple[str, str]], events: list[Event]) -> Result:
    return replay(nodes, events, first_fit_rule(nodes, shapes_of(nodes)))


def first_fit_count(
    nodes: list[tuple[str, str]],
    shapes: dict[str, topo.Topology],
    free: dict[str, int],
    held: dict[int, tuple[str, int]],
    events: list[Event],
) -> int:
    """The pods first-fit places over `events` from the given state (left as it was)."""
    free, held = dict(free), dict(held)
    rule = first_fit_rule(nodes, shapes)
    placed = 0
    for what, pod, size in events:
        if what == "leave":
            if pod in held:
                name, block = held.pop(pod)
                free[name] |= block
        elif (chosen := rule(0, size, free, held)) is not None:
            name, block = chosen
            free[name] &= ~block
            held[pod] = chosen
            placed += 1
    return placed


def lookahead_replay(nodes: list[tuple[str, str]], events: list[Event], horizon: int) -> Result:
    """An oracle that knows the next `horizon` events: at each arrival it tries every node that fits (its lowest
    valid set), replays the next `horizon` events with first-fit from there, and keeps the node that places most
    (the first on a tie). Not a scheduler (no scheduler knows the future): the floor of what looking ahead buys."""
    shapes = shapes_of(nodes)

    def rule(step: int, size: int, free: dict[str, int], held: dict[int, tuple[str, int]]) -> tuple[str, int] | None:
        best: tuple[int, str, int] | None = None
        future = events[step + 1 : step + 1 + horizon]
        pod = events[step][1]
        for name, _ in nodes:
            block = lowest_set(shapes[name], free[name], size)
            if block is None:
                continue
            free[name] &= ~block
            held[pod] = (name, block)
            count = first_fit_count(nodes, shapes, free, held, future)
            free[name] |= block
            del held[pod]
            if best is None or count > best[0]:
                best = (count, name, block)
        return None if best is None else best[1:]

    return replay(nodes, events, rule)


def loosest_replay(nodes: list[tuple[str, str]], events: list[Event]) -> Result:
    """The best online rule found for `departures-N` (not kubegpu's): at each arrival, the node whose free valid
    set (the neuron plugin's choice rule) stops the fewest of the sizes some node takes from fitting there, then
    the node left with the most free devices, then node order. It ranks lexicographically, which the engine's
    weighed sum of scores cannot: the reference of how close an online policy gets to never placing fewer pods
    than first-fit with departures. What it pays for that: the fewest empty big nodes, so about half first-fit's
    pods of 12 or 16 devices, and in the first table (no departures) fewer pods than first-fit where one node is
    the only home of a size (random-1: the 12-device pods' only inf2.48xlarge takes the first 2-device pod)."""
    shapes = shapes_of(nodes)
    sizes = 0
    for shape in shapes.values():
        sizes |= sum(1 << size for size in topo.valid_sizes(shape))

    def rule(step: int, size: int, free: dict[str, int], held: dict[int, tuple[str, int]]) -> tuple[str, int] | None:
        best: tuple[tuple[int, int, int], str, int] | None = None
        for i, (name, _) in enumerate(nodes):
            shape, left = shapes[name], free[name]
            chosen = topo.choose_devices(shape, 1, left, left, size)
            if chosen is None:
                continue
            lost = topo.fitting_sizes(shape, left) & ~topo.fitting_sizes(shape, left & ~chosen) & sizes
            key = (lost.bit_count(), -(left & ~chosen).bit_count(), i)
            if best is None or key < best[0]:
                best = (key, name, chosen)
        return None if best is None else best[1:]

    return replay(nodes, events, rule)


def emptiest_replay(nodes: list[tuple[str, str]], events: list[Event]) -> Result:
    """Worst-fit (a reference, not kubegpu's): at each arrival the node left with the most free devices, node order
    on ties, and on it the neuron plugin's choice of devices. The best rule found for pods placed with departures
    (near the oracle's), and below first-fit on the static workloads where one node is the only home of a size:
    spreading breaks it first."""
    return replay(nodes, events, _ranked_rule(nodes, lambda i, left, chosen: (-(left & ~chosen).bit_count(), i)))


def same_node_replay(nodes: list[tuple[str, str]], events: list[Event]) -> Result:
    """First-fit's node, the neuron plugin's choice of devices on it (a reference): a rule that differs from
    first-fit only within a node. How often it places fewer pods than first-fit measures how far a mix's count moves
    with any change at all, before a rule is better or worse on average."""
    return replay(nodes, events, _ranked_rule(nodes, lambda i, left, chosen: (i,)))


def guarded_replay(nodes: list[tuple[str, str]], events: list[Event]) -> Result:
    """The best rule found that places at least first-fit's pods on every static workload (a reference): until a
    pod it placed has left, the node whose choice takes the fewest sizes from their last home (no other node still
    takes them), then the fewest sizes lost on it, then the most free devices left, then node order; once one has
    left, worst-fit (`emptiest_replay`), the last homes lost breaking ties. The switch reads the workload (pods that
    never leave), which a scheduler of a live cluster, where pods leave all the time, could not."""
    shapes = shapes_of(nodes)
    sizes = 0
    for shape in shapes.values():
        sizes |= sum(1 << size for size in topo.valid_sizes(shape))
    placed = 0

    def rule(step: int, size: int, free: dict[str, int], held: dict[int, tuple[str, int]]) -> tuple[str, int] | None:
        nonlocal placed
        fits = {name: topo.fitting_sizes(shapes[name], free[name]) & sizes for name, _ in nodes}
        homes: dict[int, int] = {}
        for mask in fits.values():
            for bit in range(mask.bit_length()):
                homes[bit] = homes.get(bit, 0) + (mask >> bit & 1)
        departed = len(held) < placed
        best: tuple[tuple[int, ...], str, int] | None = None
        for i, (name, _) in enumerate(nodes):
            shape, left = shapes[name], free[name]
            chosen = topo.choose_devices(shape, 1, left, left, size)
            if chosen is None:
                continue
            lost = fits[name] & ~topo.fitting_sizes(shape, left & ~chosen)
            last = sum(1 for bit in range(lost.bit_length()) if lost >> bit & 1 and homes[bit] == 1)
            spare = (left & ~chosen).bit_count()
            key = (-spare, last, i) if departed else (last, lost.bit_count(), -spare, i)
            if best is None or key < best[0]:
                best = (key, name, chosen)
        placed += best is not None
        return None if best is None else best[1:]

    return replay(nodes, events, rule)


def _ranked_rule(nodes: list[tuple[str, str]], key: Callable[[int, int, int], tuple[int, ...]]) -> Rule:
    """The node of the least `key(node index, its free devices, the devices chosen there)` among those that fit,
    with the neuron plugin's choice of devices (`topo.choose_devices`)."""
    shapes = shapes_of(nodes)

    def rule(step: int, size: int, free: dict[str, int], held: dict[int, tuple[str, int]]) -> tuple[str, int] | None:
        best: tuple[tuple[int, ...], str, int] | None = None
        for i, (name, _) in enumerate(nodes):
            left = free[name]
            chosen = topo.choose_devices(shapes[name], 1, left, left, size)
            if chosen is not None and (best is None or key(i, left, chosen) < best[0]):
                best = (key(i, left, chosen), name, chosen)
        return None if best is None else best[1:]

    return rule


@dataclass(frozen=True)
class OneChange:
    """What one decision other than first-fit's does to a mix (`one_change`). `deltas`: for each single change, the
    pods placed minus first-fit's on the mix's own events; `sampled`: for each change sampled, the same on each of
    the futures drawn for it; `points`: per decision point sampled, the indices of its changes in `sampled`."""

    deltas: tuple[int, ...]
    sampled: tuple[tuple[int, ...], ...]
    points: tuple[tuple[int, ...], ...]


def one_change(
    nodes: list[tuple[str, str]],
    events: list[Event],
    seed: int,
    points: int = 5,
    futures: int = 20,
    pods: int = 400,
    lifetime: float = 300.0,
) -> OneChange:
    """First-fit with exactly one arrival sent to another node that fits (its lowest valid set there), then
    first-fit again: the measured floor of any online rule that differs from first-fit. Every decision point
    (an arrival first-fit places where another node also fits) and every such other node is tried on the mix's own
    events. Then at `points` decision points drawn with `seed`, each change is replayed against `futures` futures
    drawn from what an online scheduler knows there (the held pods' remaining lifetimes, exponential hence
    memoryless, and the arrivals still to come, drawn as `departure_mixes` draws them) beside first-fit's own
    choice on the same future: a rule that sees only the past makes the same choice on all of them."""
    shapes = shapes_of(nodes)
    rule = first_fit_rule(nodes, shapes)
    free = {name: (1 << SHAPES[kind]) - 1 for name, kind in nodes}
    held: dict[int, tuple[str, int]] = {}
    placed, deltas = 0, []
    # The decision points: (pod, free devices per node, pods held, first-fit's choice, the other nodes' choices).
    candidates: list[tuple[int, dict[str, int], dict[int, tuple[str, int]], tuple[str, int], list[tuple[str, int]]]]
    candidates = []
    total = first_fit_replay(nodes, events).placed

    def count(
        at: dict[str, int], hold: dict[int, tuple[str, int]], pod: int, choice: tuple[str, int], rest: list[Event]
    ) -> int:
        at, hold = dict(at), dict(hold)
        at[choice[0]] &= ~choice[1]
        hold[pod] = choice
        return first_fit_count(nodes, shapes, at, hold, rest)

    for step, (what, pod, size) in enumerate(events):
        if what == "leave":
            if pod in held:
                name, block = held.pop(pod)
                free[name] |= block
            continue
        if (chosen := rule(step, size, free, held)) is None:
            continue
        others = [
            (n, b) for n, _ in nodes if n != chosen[0] and (b := lowest_set(shapes[n], free[n], size)) is not None
        ]
        for other in others:
            deltas.append(placed + 1 + count(free, held, pod, other, events[step + 1 :]) - total)
        if others:
            candidates.append((pod, dict(free), dict(held), chosen, others))
        free[chosen[0]] &= ~chosen[1]
        held[pod] = chosen
        placed += 1
    rng = random.Random(seed)
    sampled: list[tuple[int, ...]] = []
    groups: list[tuple[int, ...]] = []
    for pod, at, hold, chosen, others in rng.sample(candidates, min(points, len(candidates))):
        alive = [*hold, pod]
        drawn = []
        for _ in range(futures):
            leaving = [(pod + rng.expovariate(1 / lifetime), p) for p in alive]
            heapq.heapify(leaving)
            drawn.append(mix_events(rng, pod + 1, leaving, pods, lifetime))
        base = [count(at, hold, pod, chosen, rest) for rest in drawn]
        first = len(sampled)
        for other in others:
            sampled.append(tuple(count(at, hold, pod, other, rest) - b for rest, b in zip(drawn, base, strict=True)))
        groups.append(tuple(range(first, len(sampled))))
    return OneChange(tuple(deltas), tuple(sampled), tuple(groups))


def kubegpu_replay(nodes: list[tuple[str, str]], events: list[Event]) -> Result:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    for name, kind in nodes:
        engine.add_node(node_info(node_document(name, kind)))
    held: dict[int, int] = {}
    placed = busy = large = 0
    for what, pod, size in events:
        if what == "leave":
            if engine.release(f"bench/p{pod}") is not None:
                del held[pod]
        elif engine.schedule(pod_request(pod_document(f"p{pod}", size))[0]).scheduled:
            held[pod] = size
            placed += 1
            large += size >= LARGE
        busy += sum(held.values())
    stranded = sum(o.free - o.largest_fit for name in engine.node_names() for o in engine.describe(name))
    return Result(placed, stranded, busy, large)


def departure_mixes(
    count: int, nodes: int = 12, pods: int = 400, lifetime: float = 300.0, first: int = 0
) -> list[tuple[str, list[tuple[str, str]], list[Event]]]:
    """`departures-N`: `nodes` nodes of random types and `pods` arrivals of the random sizes, one per step; each pod
    leaves `lifetime` steps after it arrived on average (exponentially distributed, placed or not), so about 30 % of
    the events are departures."""
    found = []
    for seed in range(first, first + count):
        rng = random.Random(seed)
        kinds = [rng.choice(list(SHAPES)) for _ in range(nodes)]
        members = [(f"{kind.split('.')[0]}-{i}", kind) for i, kind in enumerate(kinds)]
        found.append((f"departures-{seed}", members, mix_events(rng, 0, [], pods, lifetime)))
    return found


def mix_events(
    rng: random.Random, first: int, leaving: list[tuple[float, int]], pods: int, lifetime: float
) -> list[Event]:
    """The events of pods `first` to `pods - 1` arriving one per step (sizes and lifetimes drawn from `rng`), with
    the departures of the pods already there (`leaving`: (step, pod), a heap) interleaved."""
    events: list[Event] = []
    for pod in range(first, pods):
        while leaving and leaving[0][0] <= pod:
            events.append(("leave", heapq.heappop(leaving)[1], 0))
        events.append(("arrive", pod, rng.choice(RANDOM_SIZES)))
        heapq.heappush(leaving, (pod + rng.expovariate(1 / lifetime), pod))
    return events


def workloads(seeds: int) -> list[tuple[str, list[tuple[str, str]], list[int]]]:
    found = [("issue-example", [("trn1-0", "trn1.32xlarge"), ("inf2-0", "inf2.48xlarge")], [4, 8, 1, 3, 2, 4])]
    for seed in range(seeds):
        rng = random.Random(seed)
        kinds = [rng.choice(list(SHAPES)) for _ in range(rng.randint(2, 6))]
        nodes = [(f"{kind.split('.')[0]}-{i}", kind) for i, kind in enumerate(kinds)]
        capacity = sum(SHAPES[k] for k in kinds)
        sizes: list[int] = []
        while sum(sizes) < capacity * 1.3:
            sizes.append(rng.choice(RANDOM_SIZES))
        found.append((f"random-{seed}", nodes, sizes))
    for seed in range(seeds):
        rng = random.Random(1000 + seed)
        count = rng.randint(1, 3)
        nodes = [(f"inf2-{i}", "inf2.48xlarge") for i in range(count)]  # rings listed first: first-fit fills them
        nodes += [(f"trn1-{i}", "trn1.32xlarge") for i in range(count)]
        capacity = 28 * count
        sizes = []
        while sum(sizes) < capacity:
            sizes.append(rng.choice([4, 8]) if rng.random() < 0.55 else rng.choice([2, 3, 5, 6]))
        found.append((f"fragmenting-{seed}", nodes, sizes))
    return found


def print_one_change(found: list[OneChange]) -> None:
    """The summary of `one_change` over the mixes: how often one decision other than first-fit's ends below it, by
    how much, and on how many of the futures an online rule could not tell apart."""
    deltas = [delta for result in found for delta in result.deltas]
    below = [delta for delta in deltas if delta < 0]
    n = max(len(deltas), 1)
    print(
        f"one change (one arrival sent to another node that fits, first-fit before and after): {len(deltas)} changes; "
        f"below first-fit {len(below) / n:.1%} (by {-sum(below) / max(len(below), 1):.1f} pods on average, at worst "
        f"{-min(deltas, default=0)}), equal {sum(d == 0 for d in deltas) / n:.1%}, above "
        f"{sum(d > 0 for d in deltas) / n:.1%}, {sum(deltas) / n:+.2f} pods on average; some change below on "
        f"{sum(any(d < 0 for d in r.deltas) for r in found)} of {len(found)} mixes"
    )
    sampled = [futures for result in found for futures in result.sampled]
    if not sampled:
        return
    pairs = [d for futures in sampled for d in futures]
    best = [
        min(sum(d < 0 for d in r.sampled[i]) / len(r.sampled[i]) for i in group) for r in found for group in r.points
    ]
    print(
        f"  on {len(sampled[0])} futures drawn at each of {len(best)} decision points (what the scheduler knows there, "
        f"the rest drawn): of {len(sampled)} changes, {sum(any(d < 0 for d in f) for f in sampled) / len(sampled):.1%} "
        f"below first-fit on at least one future, on {sum(d < 0 for d in pairs) / len(pairs):.1%} of futures in all "
        f"({sum(pairs) / len(pairs):+.2f} pods on average); the change least often below, point by point, on "
        f"{sum(best) / len(best):.1%} of futures; every change below on some future at "
        f"{sum(b > 0 for b in best) / len(best):.1%} of the points"
    )


# The online rules `--references` prints beside kubegpu and first-fit.
ONE_CHANGE = "one-change"  # not a rule: `one_change`, first-fit with one decision changed
REFERENCES: dict[str, Callable[[list[tuple[str, str]], list[Event]], Result]] = {
    "loosest": loosest_replay,
    "emptiest": emptiest_replay,
    "same-node": same_node_replay,
    "guarded": guarded_replay,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--departure-mixes", type=int, default=6, help="departures-N mixes (12 nodes x 400 pods)")
    parser.add_argument(
        "--first-mix", type=int, default=0, metavar="N", help="the departures mixes start at departures-N (default 0)"
    )
    parser.add_argument(
        "--references",
        nargs="+",
        choices=[*REFERENCES, ONE_CHANGE],
        default=[],
        metavar="RULE",
        help=f"also print these online rules ({', '.join(REFERENCES)}; `--loosest`: loosest alone): pods placed, "
        f"and with departures pods of >=12 devices; `{ONE_CHANGE}`: with departures, first-fit with one decision "
        "changed, every one in turn (the floor of any rule that differs from first-fit)",
    )
    parser.add_argument("--loosest", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--lookahead",
        type=int,
        default=0,
        metavar="EVENTS",
        help="also print an oracle that knows the next EVENTS events (first-fit looking ahead; 0: none)",
    )
    args = parser.parse_args()
    chosen = list(dict.fromkeys(args.references + (["loosest"] if args.loosest else [])))
    references = [rule for rule in chosen if rule != ONE_CHANGE]
    changes = ONE_CHANGE in chosen
    print(
        f"{'workload':16} {'pods':>5} {'first-fit placed':>17} {'kubegpu placed':>15} "
        f"{'ff stranded':>12} {'kg stranded':>12}" + "".join(f" {name:>10}" for name in references)
    )
    totals = [0] * (5 + len(references))
    fewer_static = [0] * len(references)
    for name, nodes, sizes in workloads(args.seeds):
        ff, kg = first_fit(nodes, sizes), kubegpu(nodes, sizes)
        others = [REFERENCES[rule](nodes, arrivals(sizes)).placed for rule in references]
        fewer_static = [n + (placed < ff.placed) for n, placed in zip(fewer_static, others, strict=True)]
        mark = "" if kg.placed >= ff.placed else "  <-- fewer than first-fit"
        extra = "".join(f" {placed:10}" for placed in others)
        print(f"{name:16} {len(sizes):5} {ff.placed:17} {kg.placed:15} {ff.stranded:12} {kg.stranded:12}{extra}{mark}")
        values = (len(sizes), ff.placed, kg.placed, ff.stranded, kg.stranded, *others)
        totals = [a + b for a, b in zip(totals, values, strict=True)]
    extra = "".join(f" {placed:10}" for placed in totals[5:])
    print(f"{'total':16} {totals[0]:5} {totals[1]:17} {totals[2]:15} {totals[3]:12} {totals[4]:12}{extra}")
    print(f"kubegpu / first-fit pods placed: {totals[2] / totals[1]:.3f}")
    for rule, placed, fewer in zip(references, totals[5:], fewer_static, strict=True):
        print(f"{rule} rule / first-fit pods placed: {placed / totals[1]:.3f} (fewer on {fewer})")
    print()
    heads = "".join(f" {rule[:6]:>6} {'>=12':>6}" for rule in references)
    oracle = f" {'oracle':>7}" if args.lookahead else ""
    oracle += f" {'1-chg':>6} {'below':>6}" if changes else ""
    print(
        f"{'workload':16} {'events':>6} {'ff placed':>10} {'kg placed':>10} {'ff dev-steps':>13} {'kg dev-steps':>13} "
        f"{'ff >=12':>8} {'kg >=12':>8} {'ff strand':>10} {'kg strand':>10}{heads}{oracle}"
    )
    widths = WIDTHS + (6, 6) * len(references) + ((7,) if args.lookahead else ()) + ((6, 6) if changes else ())
    found: list[OneChange] = []
    sums = [0] * len(widths)
    fewer = worst = oracle_fewer = 0
    rule_fewer, rule_worst = [0] * len(references), [0] * len(references)
    rule_busy, oracle_busy = [0] * len(references), 0  # device-steps, summed: what the placed pods held
    for seed, (name, nodes, events) in enumerate(departure_mixes(args.departure_mixes, first=args.first_mix)):
        ff, kg = first_fit_replay(nodes, events), kubegpu_replay(nodes, events)
        fewer += kg.placed < ff.placed
        worst = min(worst, kg.placed - ff.placed)
        row: tuple[int, ...] = (ff.placed, kg.placed, ff.busy, kg.busy, ff.large, kg.large, ff.stranded, kg.stranded)
        for at, rule in enumerate(references):
            result = REFERENCES[rule](nodes, events)
            rule_fewer[at] += result.placed < ff.placed
            rule_worst[at] = min(rule_worst[at], result.placed - ff.placed)
            rule_busy[at] += result.busy
            row += (result.placed, result.large)
        if args.lookahead:
            ahead = lookahead_replay(nodes, events, args.lookahead)
            oracle_fewer += ahead.placed < ff.placed
            oracle_busy += ahead.busy
            row += (ahead.placed,)
        if changes:
            found.append(one_change(nodes, events, seed=args.first_mix + seed))
            row += (len(found[-1].deltas), sum(delta < 0 for delta in found[-1].deltas))
        print(f"{name:16} {len(events):6} " + " ".join(f"{v:{w}}" for v, w in zip(row, widths, strict=True)))
        sums = [a + b for a, b in zip(sums, row, strict=True)]
    print(f"{'total':16} {'':6} " + " ".join(f"{v:{w}}" for v, w in zip(sums, widths, strict=True)))
    print(
        f"kubegpu / first-fit with departures: pods placed {sums[1] / sums[0]:.3f} (fewer on {fewer} of "
        f"{args.departure_mixes} mixes, at worst {-worst}), device-steps {sums[3] / sums[2]:.3f}, pods of >=12 "
        f"devices {sums[5] / max(sums[4], 1):.3f}"
    )
    for at, rule in enumerate(references):
        placed, large = sums[len(WIDTHS) + 2 * at], sums[len(WIDTHS) + 2 * at + 1]
        print(
            f"{rule} rule / first-fit: pods placed {placed / sums[0]:.3f} (fewer on {rule_fewer[at]} of "
            f"{args.departure_mixes} mixes, at worst {-rule_worst[at]}), device-steps {rule_busy[at] / sums[2]:.3f}, "
            f"pods of >=12 devices {large / max(sums[4], 1):.3f}"
        )
    if args.lookahead:
        print(
            f"oracle (first-fit knowing the next {args.lookahead} events) / first-fit: pods placed "
            f"{sums[len(WIDTHS) + 2 * len(references)] / sums[0]:.3f} (fewer on {oracle_fewer} of "
            f"{args.departure_mixes} mixes), device-steps {oracle_busy / sums[2]:.3f}"
        )
    if changes:
        print_one_change(found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
