"""kube-scheduler's sample taken from each shape's remembered answers (`engine.sampling`) places exactly as the walk
node by node: the same node for every pod, the same refusal word for word, the same start for the next sample.

The oracle is the same engine with the shortcut off (`_sample_by_shape` answering None: every cycle walks the node
tree node by node, `Cycle._schedule_sampled`). The traces are generated here (the suite runs without ../shared):
GPU nodes of three models in three zones, some CPU-only, tainted or unschedulable; shares, whole and multi-GPU pods,
CPU-only pods, pods bound to a model, pods no node could ever hold; arriving and leaving on a timeline, so nodes
fill and free again.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Decision, Engine
from kubegpu.scheduler.traces import TraceNode, TracePod, node_document, pod_document

MODELS = ("V100M16", "T4", "A100")
ZONES = ("zone-a", "zone-b", "zone-c")


def generated_nodes(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Node manifests as the trace reader writes them, some in zones (kube-scheduler's node tree interleaves them),
    some tainted or cordoned (refused by the filters that read only the node)."""
    documents = []
    for i in range(count):
        gpus = rng.choice((0, 1, 2, 4, 4, 8))
        node = TraceNode(f"node-{i}", rng.choice((8000, 16000, 32000, 64000)), rng.choice((65536, 262144)), gpus,
                         rng.choice(MODELS) if gpus else "")  # fmt: skip
        document: dict[str, Any] = node_document(node)
        metadata = document["metadata"]
        if rng.random() < 0.6:
            metadata["labels"]["topology.kubernetes.io/zone"] = rng.choice(ZONES)
        if rng.random() < 0.05:
            document["spec"] = {"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}
        elif rng.random() < 0.03:
            document["spec"] = {"unschedulable": True}
        documents.append(document)
    return documents


def generated_pods(rng: random.Random, count: int) -> list[tuple[TracePod, int]]:
    """(pod, how many arrivals later it leaves; 0: never)."""
    pods = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.45:
            gpus, milli = 1, rng.choice((100, 250, 300, 500, 700))
        elif kind < 0.75:
            gpus, milli = rng.choice((1, 1, 2, 4, 8)), 1000
        else:
            gpus, milli = 0, 0
        cpu = rng.choice((1000, 2000, 4000, 8000, 16000, 128000 if rng.random() < 0.1 else 2000))
        models = tuple(rng.sample(MODELS, rng.choice((1, 2)))) if gpus and rng.random() < 0.2 else ()
        pod = TracePod(f"pod-{i}", cpu, rng.choice((1024, 8192, 65536)), gpus, milli, models)
        pods.append((pod, rng.choice((0, 0, 0, rng.randint(1, 200)))))
    return pods


def engine(percentage: int = 0) -> Engine:
    profile = scores.Profile.default("binpack")
    if percentage:
        profile = scores.Profile(profile.weights, percentage_of_nodes_to_score=percentage)
    return Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), scoring=profile)


def walking(oracle: Engine) -> Engine:
    """The engine with the shortcuts off: every cycle walks the nodes one by one."""
    oracle._sample_by_shape = lambda *cycle: None  # type: ignore[method-assign]
    oracle._every_node_by_shape = lambda *cycle: None  # type: ignore[method-assign]
    return oracle


def replay(
    subject: Engine,
    nodes: list[dict[str, Any]],
    pods: list[tuple[TracePod, int]],
    before: Callable[[Engine, int], None] | None = None,
) -> list[object]:
    """Each arrival's decision (node, reason, code) and where the next sample starts, pods leaving on time;
    `before(subject, step)` changes the cluster before an arrival."""
    for document in nodes:
        subject.add_node(node_info(document))
    seen: list[object] = []
    leaving: dict[int, list[str]] = {}
    for step, (pod, stay) in enumerate(pods):
        for key in leaving.pop(step, ()):
            subject.release(key)
        if before is not None:
            before(subject, step)
        request = pod_request(pod_document(pod, pod.name))[0]
        decision: Decision = subject.schedule(request)
        seen.append((pod.name, decision.node, decision.reason, decision.code, subject._next_start))
        if decision.scheduled and stay:
            leaving.setdefault(step + stay, []).append(request.key)
    return seen


@pytest.mark.parametrize("percentage", [0, 30, 100], ids=["adaptive", "30%", "every node"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_remembered_answers_place_as_the_walk_node_by_node(seed: int, percentage: int) -> None:
    """kube-scheduler's adaptive count and 30 % (a sample from a rotating start), and every node (100 %: the
    capacity index's order)."""
    rng = random.Random(seed)
    nodes = generated_nodes(rng, rng.randint(130, 170))
    pods = generated_pods(rng, 700)
    taken: list[bool] = []
    subject = engine(percentage)
    name = "_every_node_by_shape" if percentage == 100 else "_sample_by_shape"
    shortcut = getattr(subject, name)

    def counted(*cycle: Any) -> Any:
        answer = shortcut(*cycle)
        taken.append(answer is not None)
        return answer

    setattr(subject, name, counted)
    assert replay(subject, nodes, pods) == replay(walking(engine(percentage)), nodes, pods)
    assert sum(taken) > len(taken) // 2, "most cycles took the shortcut (else this test holds nothing)"


def changing(document: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The node cordoned, uncordoned, tainted, untainted, tolerated or moved to another zone: a change of its class."""
    changed: dict[str, Any] = {**document, "metadata": {**document["metadata"]}}
    labels = changed["metadata"]["labels"] = dict(document["metadata"]["labels"])
    kind = rng.randrange(4)
    if kind == 0:
        changed["spec"] = {"unschedulable": True}
    elif kind == 1:
        changed["spec"] = {"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}
    elif kind == 2:
        changed["spec"] = {}
    else:
        labels["topology.kubernetes.io/zone"] = rng.choice(ZONES)
    return changed


@pytest.mark.parametrize("percentage", [0, 100], ids=["adaptive", "every node"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_nodes_changing_class_between_arrivals_place_as_the_walk(seed: int, percentage: int) -> None:
    """A shape's answers of the filters that read only the node are kept per node class (`ShapeAnswers.by_class`):
    nodes cordoned, tainted, freed of their taint or moved between zones while pods of the shapes seen come and go
    are answered as their new class answers, as the walk node by node answers them."""
    rng = random.Random(seed)
    nodes = generated_nodes(rng, rng.randint(40, 80))
    pods = generated_pods(rng, 300)
    changes = {step: rng.randrange(len(nodes)) for step in rng.sample(range(len(pods)), 60)}

    def replayed(subject: Engine) -> list[object]:
        now = list(nodes)
        change_rng = random.Random(seed)

        def change(engine: Engine, step: int) -> None:
            if step in changes:
                at = changes[step]
                now[at] = changing(now[at], change_rng)
                engine.add_node(node_info(now[at]))

        return replay(subject, now, pods, change)

    assert replayed(engine(percentage)) == replayed(walking(engine(percentage)))


@pytest.mark.parametrize("percentage", [0, 30], ids=["adaptive", "30%"])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_nodes_leaving_and_joining_between_arrivals_place_as_the_walk(seed: int, percentage: int) -> None:
    """A shape keeps its fitting nodes in the node tree's order (`ShapeAnswers.positions`): nodes removed (their
    pods with them) and nodes joining, which move every later node's place in that order, leave each sample, its
    node and where the next one starts as the walk node by node finds them."""
    rng = random.Random(seed)
    nodes = generated_nodes(rng, rng.randint(130, 170))
    pods = generated_pods(rng, 500)
    leaving: dict[int, list[int]] = {}  # step -> the nodes (by index) removed before its arrival
    joining: dict[int, list[int]] = {}  # step -> the nodes added back, each at the end of its zone's list
    for step in rng.sample(range(len(pods) - 1), 30):
        at = rng.randrange(len(nodes))
        leaving.setdefault(step, []).append(at)
        joining.setdefault(rng.randint(step + 1, min(len(pods) - 1, step + 100)), []).append(at)

    def replayed(subject: Engine) -> list[object]:
        def change(engine: Engine, step: int) -> None:
            for at in leaving.get(step, ()):
                engine.remove_node(nodes[at]["metadata"]["name"])
            for at in joining.get(step, ()):
                engine.add_node(node_info(nodes[at]))

        return replay(subject, nodes, pods, change)

    assert replayed(engine(percentage)) == replayed(walking(engine(percentage)))


def test_a_pod_of_a_shape_seen_before_asks_only_the_nodes_changed_since() -> None:
    """The point of the shortcut: the second pod of a shape filters the one node the first changed, not the
    cluster again; a pod no node fits is refused without filtering every node either."""
    rng = random.Random(7)
    subject = engine()
    for document in generated_nodes(rng, 150):
        subject.add_node(node_info(document))
    asked: list[str] = []  # the nodes answered anew
    answer = subject._answer

    def counting(record: Any, *asking: Any) -> Any:
        asked.append(record.name)
        return answer(record, *asking)

    subject._answer = counting  # type: ignore[method-assign]
    share = TracePod("share", 1000, 1024, 1, 300, ())
    first = subject.schedule(pod_request(pod_document(share, "first"))[0])
    assert first.scheduled
    asked.clear()
    second = subject.schedule(pod_request(pod_document(share, "second"))[0])
    assert second.scheduled
    assert asked == [first.node]
    huge = TracePod("huge", 1000, 1024, 64, 1000, ())
    subject.schedule(pod_request(pod_document(huge, "huge-1"))[0])
    asked.clear()
    refused = subject.schedule(pod_request(pod_document(huge, "huge-2"))[0])
    assert not refused.scheduled and refused.reason.startswith("0/150 nodes are available: ")
    assert len(asked) <= 1


def test_a_node_whose_books_are_their_own_content_is_asked_again_after_they_change() -> None:
    """A plugin state whose scoring content is the state itself (the kit's shared books, intel-gas's cards: one
    identity while its books change) numbers no content to remember answers by: card 1 with 4G free after d and e
    takes the 4G pod that both cards' 2G refused after a and b, though the node's usage (12G, two pods) and its
    headroom (4G in all) read the same both times. Before, the shape's answer from the first refusal was given
    again: "the most free on any card is 2G"."""
    from kubegpu.core.testing import make_node, make_pod
    from kubegpu.plugins.intel_gas import scheduler as gas

    def gas_pod(name: str, memory: str) -> Any:
        return make_pod(name, {"main": {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": memory}})

    subject = Engine(make_plugin_manager("scheduler", plugins=[("intel-gas", gas)], autoload=False))
    labels = {"gpu.intel.com/gpu-numbers": "0.1"}
    allocatable = {"gpu.intel.com/i915": 8, "gpu.intel.com/memory.max": "16G"}
    subject.add_node(make_node("intel-a", labels=labels, allocatable=allocatable))  # 8G a card
    for name in ("a", "b"):  # 6G on each card
        assert subject.schedule(gas_pod(name, "6G")).scheduled
    refused = subject.schedule(gas_pod("c1", "4G"))
    assert not refused.scheduled and "the most free on any card is 2G" in refused.reason
    subject.release("default/a")
    subject.release("default/b")
    for name, memory in (("d", "8G"), ("e", "4G")):  # card 0 full, 4G left on card 1
        assert subject.schedule(gas_pod(name, memory)).scheduled
    decision = subject.schedule(gas_pod("c2", "4G"))
    assert (decision.node, decision.reason) == ("intel-a", None)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), arrivals=st.integers(0, 120))
def test_a_shape_first_asked_sums_its_answers_as_the_nodes_one_by_one(seed: int, arrivals: int) -> None:
    # A shape's first cycle answers every node (`_every_answer`): once per content number, summed once per distinct
    # answer with its count. The oracle sums node by node in the nodes' order, as the loop over changed nodes does:
    # the same answers, the same sums, their keys in the same order (a refusal lists its reasons in that order).
    from collections import Counter

    from kubegpu.core.status import Code, Status
    from kubegpu.scheduler.engine.records import CPU_INDEX

    rng = random.Random(seed)
    subject = engine()
    for document in generated_nodes(rng, rng.randint(20, 60)):
        subject.add_node(node_info(document))
    for pod, _ in generated_pods(rng, arrivals):
        subject.schedule(pod_request(pod_document(pod, pod.name))[0])
    for pod, _ in generated_pods(rng, 5):
        request = pod_request(pod_document(pod, pod.name))[0]
        plan = subject.plan(request)
        resource, need = (CPU_INDEX, request.cpu_milli) if not pod.gpus else ("nvidia.com/gpu", pod.gpus)
        index = subject._index.get(resource)
        assert index is not None
        subject._shape_memo.clear()
        book = subject._shape_answers(request, plan, index, resource, need)
        short = Status.unschedulable(f"Insufficient {resource}")
        reasons: Counter[str] = Counter()
        fitting: Counter[int] = Counter()
        unresolvable: Counter[int] = Counter()
        resolvable = by_usage = 0
        for name, record in subject.nodes.items():
            answer = subject._answer(record, request, plan, index.get, need, short, {})
            assert book.finals[name] == answer and book.fits[name] is answer[2]
            for reason in answer[0].reasons:
                reasons[reason] += 1
            if answer[0].code is Code.UNRESOLVABLE:
                unresolvable[answer[1]] += 1
            else:
                resolvable += 1
            fitting[answer[1]] += answer[2]
            by_usage += answer[3]
        assert list(book.finals) == list(subject.nodes)
        assert list(book.reasons.items()) == list(reasons.items())
        assert list(book.fitting.items()) == list(fitting.items())
        assert list(book.unresolvable.items()) == list(unresolvable.items())
        assert (book.resolvable, book.by_usage) == (resolvable, by_usage)


@pytest.mark.parametrize("lead", [True, False], ids=["fragmentation leads", "weighed sum"])
@pytest.mark.parametrize("policy", ["binpack", "spread"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_the_sample_ranked_per_content_picks_the_node_ranking_node_by_node_picks(
    seed: int, policy: Literal["binpack", "spread"], lead: bool
) -> None:
    """`_rank_sampled` ranks each distinct content once (`Scoring._local_by_content`): on any feasible nodes in any
    order, nodes of one content apart in the sample and nodes of different contents tied on every score (nodes alike
    but their zone) among them, it picks the node `_rank` picks node by node, the first in the sample's order on a
    tie."""
    rng = random.Random(seed)
    profile = dataclasses.replace(scores.Profile.default(policy), fragmentation_lead=lead)
    plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    subject = Engine(plugins, policy=policy, scoring=profile)
    for document in generated_nodes(rng, rng.randint(10, 25)):
        subject.add_node(node_info(document))
        for twin in ("twin-a", "twin-b"):  # two of another class, alike in all the scores read
            metadata = {**document["metadata"], "name": f"{document['metadata']['name']}-{twin}"}
            metadata["labels"] = {**metadata["labels"], "topology.kubernetes.io/zone": "zone-twin"}
            subject.add_node(node_info({**document, "metadata": metadata}))
    for pod, _ in generated_pods(rng, rng.randint(0, 40)):
        subject.schedule(pod_request(pod_document(pod, pod.name))[0])
    for pod, _ in generated_pods(rng, 6):
        request = pod_request(pod_document(pod, pod.name))[0]
        plan = subject.plan(request)
        fitting = [name for name, record in subject.nodes.items() if subject.check(record, request, plan).ok]
        for _ in range(3):
            feasible = rng.sample(fitting, rng.randint(0, len(fitting)))
            if len(feasible) > 1:
                assert subject._rank_sampled(feasible, request, plan) == subject._rank(feasible, request, plan)
