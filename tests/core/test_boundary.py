"""The checked boundary: every kind of wrong answer, from every hook, is named and isolated.

What a user notices: a plugin that answers `fit` with `True`, `score` with `"high"` or `allocate` with a dict does
not crash kubegpu and is not blamed on another hook; the pod's reason (or the log) names the plugin and the hook, and
the other plugins' pods are scheduled as before. Registration refuses what cannot mean anything when one plugin is
called at a time (wrappers, ordering markers, generators) with a message.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import build_parser
from kubegpu.core import device_hooks, scheduler_hooks
from kubegpu.core.annotations import (
    MAX_ANNOTATION_BYTES,
    AllocationRecord,
    AnnotationError,
    decode_allocation,
    encode_allocation,
    verify_allocation,
)
from kubegpu.core.kit import WholeDevicePlugin, label_devices
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceCell,
    DeviceInfo,
    DeviceInventory,
    NodeInfo,
    Occupancy,
    PluginAllocation,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.core.scheduler_hooks import Headroom
from kubegpu.core.status import Status
from kubegpu.core.testing import make_node, make_pod, node_manifest, pod_manifest
from kubegpu.scheduler import simulate as simulate_cli
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.testing import simulate

CARD = "cards.example/card"
OTHER = "other.example/gpu"


@pytest.fixture(autouse=True)
def _kubegpu_loggers_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A front-end run earlier in the session may have disabled kubegpu's loggers or raised their level."""
    for name in ("kubegpu", "kubegpu.plugins", "kubegpu.engine"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "disabled", False)
        monkeypatch.setattr(logger, "level", logging.NOTSET)


class Cards(WholeDevicePlugin):
    """Whole cards from the label `cards.example/card.count`."""

    resources = (CARD,)

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
        return label_devices(node.labels, f"{CARD}.count", "card"), None


class Gpus(Cards):
    resources = (OTHER,)

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
        return label_devices(node.labels, f"{OTHER}.count", "gpu"), None


def broken(hook: str, answer: object) -> Cards:
    """A `Cards` plugin whose `kubegpu_scheduler_<hook>` answers `answer`."""

    def wrong(self: Any) -> object:
        return answer

    cls = type("Broken", (Cards,), {f"kubegpu_scheduler_{hook}": scheduler_hooks.hookimpl(wrong)})
    return cls()


def manager(**plugins: object) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", plugins=plugins.items(), autoload=False)


def cluster() -> list[dict[str, Any]]:
    """Two nodes with cards and one with GPUs, a pod for each plugin, then the card pod deleted."""
    return [
        node_manifest("cards-0", labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}),
        node_manifest("gpus-0", labels={f"{OTHER}.count": "2"}, allocatable={OTHER: 2}),
        node_manifest("cards-1", labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}),
        pod_manifest("card-pod", {"main": {CARD: 1}}),
        pod_manifest("gpu-pod", {"main": {OTHER: 1}}),
        pod_manifest("card-pod", {"main": {CARD: 1}}, deleted=True),
    ]


# ------------------------------------------------------------------------------------------------------------
# Every hook, every kind of wrong answer: simulate exits 0, the plugin and the hook are named, others schedule
# ------------------------------------------------------------------------------------------------------------


def nested(depth: int) -> list[Any]:
    """A list `depth` lists deep."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


WRONG = [
    ("build_node", "state"),
    ("build_node", {"cards": 2}),
    ("headroom", {"free": {CARD: 1}}),
    ("headroom", Headroom(free={CARD: -1})),
    ("headroom", Headroom(free={CARD: 1}, utilization=math.nan)),
    ("headroom", Headroom(free={OTHER: 5})),
    ("headroom", Headroom(free={CARD: 1}, unlisted=frozenset({OTHER}))),
    ("validate", False),
    ("validate", "ok"),
    ("fit", True),
    ("fit", "ok"),
    ("fit", None),
    ("fit", Status("fits")),  # a Status whose code is no Code
    ("score", "high"),
    ("score", math.inf),
    ("score", 250),
    ("score", True),
    ("allocate", {"main": {CARD: ["card0"]}}),
    ("allocate", PluginAllocation(plugin="cards", containers={"sidecar": {CARD: ["card0"]}})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {OTHER: ["gpu0"]}})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0", "card0"]}})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": {1, 2}})),
    ("allocate", PluginAllocation(plugin="cards", annotations={"kubegpu.io/allocation": "{}"})),
    # Answers the pod could be bound with but never run with: its own take refuses them, the API server refuses the
    # annotations, or the node side's decoder refuses the allocation (too large, too deep, an integer past 64 bits).
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card9"]}})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": "y" * 300_000})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": 2**70})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": nested(40)})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, annotations={"a b": "c"})),
    (
        "allocate",
        PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, annotations={"x": "y" * 300_000}),
    ),
    # Text no UTF-8 holds (a lone surrogate): in a value the node's orjson refuses the allocation; in a key the
    # engine itself could not encode it and the whole run stopped, the card held; in an annotation the client's
    # orjson cannot write it. A '/' with no prefix before it: the API server refuses the key.
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": "\ud800"})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": {"\udc80": 1}})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, annotations={"a": "\udc80"})),
    ("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, annotations={"/x": "y"})),
    ("take", None),
    ("take", True),
    ("release", "released"),
    ("describe", "two cards"),
    ("describe", [{"family": "cards"}]),
    # a share of a pod that holds nothing there, a share of NaN: reports would draw either as the plugin said
    ("describe", [Occupancy(family="cards", cells=[DeviceCell(id="card0", holders=["a"], shares={"b": 0.5})])]),
    ("describe", [Occupancy(family="cards", cells=[DeviceCell(id="card0", holders=["a"], shares={"a": math.nan})])]),
]


def _run_simulate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], plugin: object, json_out: bool
) -> tuple[int, str, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(cluster()))
    built = manager(cards=plugin, gpus=Gpus())
    monkeypatch.setattr(simulate_cli, "make_plugin_manager", lambda side: built)
    args = build_parser().parse_args(["simulate", str(path), *(["--json"] if json_out else [])])
    code = simulate_cli.run(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("hook", "answer"), WRONG, ids=[f"{h}-{i}" for i, (h, _) in enumerate(WRONG)])
def test_simulate_survives_every_wrong_answer_and_names_the_plugin_and_the_hook(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    hook: str,
    answer: object,
) -> None:
    caplog.set_level(logging.ERROR)
    code, out, err = _run_simulate(monkeypatch, tmp_path, capsys, broken(hook, answer), json_out=hook != "describe")

    assert code == 0, err
    named = "plugin 'cards' failed"
    full = f"kubegpu_scheduler_{hook}"
    if hook == "describe":
        assert "gpus-0" in out  # the report was drawn
    else:
        records = {r["pod"]: r for r in map(json.loads, out.splitlines()) if r["event"] != "deleted"}
        assert records["default/gpu-pod"]["event"] == "scheduled", "the other plugin's pods are unaffected"
        card = records["default/card-pod"]
    told = [card["reason"] or ""] if hook != "describe" else []
    told += [r.getMessage() for r in caplog.records]
    assert any(named in text and full in text for text in told), (told, err)


class _SlyStatus(Status):
    """A Status that passes for one but fails when the engine reads whether it is a success."""

    @property
    def ok(self) -> bool:
        raise RuntimeError("ok read")


class _SlyNumber(float):
    """A float that passes for one but fails when the engine asks whether it is zero."""

    def __bool__(self) -> bool:
        raise RuntimeError("truth read")


@pytest.mark.parametrize(
    ("hook", "answer"),
    [("fit", _SlyStatus()), ("score", _SlyNumber(50.0)), ("fragmentation", _SlyNumber(1.0))],
    ids=["fit-status-subclass", "score-float-subclass", "fragmentation-float-subclass"],
)
def test_an_answer_of_a_subclass_is_used_as_the_plain_value_it_stands_for(hook: str, answer: object) -> None:
    """A third-party answer that passes its hook's contract as an instance of a subclass (a Status, a float) is
    read by the engine later, outside the plugin's call: a subclass computing on every read raised there, past the
    engine's guard of the plugin's call, and ended the whole simulation (`RuntimeError: ok read` / `truth read`).
    The contract's check hands the engine the plain value the answer stands for: every pod is placed."""
    records = simulate(cluster(), plugins={"cards": broken(hook, answer), "gpus": Gpus()})

    events = {r["pod"]: r["event"] for r in records if r["event"] != "deleted"}
    assert events == {"default/card-pod": "scheduled", "default/gpu-pod": "scheduled"}


class _SlyEpoch(int):
    """An int that passes for one but fails when the engine compares it with the epoch it remembered."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("epoch compared")

    __hash__ = int.__hash__


def test_a_fragmentation_epoch_of_an_int_subclass_is_used_as_the_plain_int() -> None:
    """The same for `kubegpu_scheduler_fragmentation_epoch`: an int subclass failing when compared ended the
    simulation (`RuntimeError: epoch compared`) at the second pod, whose cycle compares the epochs with the last."""

    def epoch(self: Any, shared: dict[str, object]) -> int:
        return _SlyEpoch(3)

    def fragmentation(self: Any, state: object, pod: object) -> float:
        return 1.0

    hooks = {"kubegpu_scheduler_fragmentation_epoch": epoch, "kubegpu_scheduler_fragmentation": fragmentation}
    plugin = type("Mixed", (Cards,), {name: scheduler_hooks.hookimpl(hook) for name, hook in hooks.items()})()
    pods = [pod_manifest(f"card-{i}", {"main": {CARD: 1}}) for i in range(3)]

    records = simulate([*cluster()[:3], *pods], plugins={"cards": plugin, "gpus": Gpus()})

    assert [r["event"] for r in records] == ["scheduled"] * 3


def test_a_wrong_answer_from_build_node_reaches_the_pod_naming_the_node() -> None:
    records = simulate(cluster()[:5], plugins={"cards": broken("build_node", "state"), "gpus": Gpus()})

    card = next(r for r in records if r["pod"] == "default/card-pod")
    assert card["event"] == "unschedulable"
    for node in ("cards-0", "cards-1"):
        assert f"plugin 'cards' failed on node {node} in kubegpu_scheduler_build_node: WrongAnswer:" in card["reason"]


def test_headroom_raising_reaches_the_pod_and_is_counted() -> None:
    plugin = Cards()

    def explode(self: Any, state: object) -> Headroom:
        raise OSError("sysfs read failed")

    cls = type("Flaky", (Cards,), {"kubegpu_scheduler_headroom": scheduler_hooks.hookimpl(explode)})
    built = manager(cards=cls(), gpus=Gpus())
    seen: list[PluginHookError] = []
    built.on_hook_failure.append(seen.append)

    records = simulate(cluster()[:5], manager=built)

    card = next(r for r in records if r["pod"] == "default/card-pod")
    assert (
        "plugin 'cards' failed on node cards-0 in kubegpu_scheduler_headroom: OSError: sysfs read failed"
        in (card["reason"])
    )
    assert built.hook_failures[("cards", "kubegpu_scheduler_headroom")] >= 1
    assert {(e.plugin, e.hook) for e in seen} == {("cards", "kubegpu_scheduler_headroom")}
    assert plugin.name == ""  # a plugin instance only learns its name when it is registered


def test_allocate_returning_a_dict_is_allocates_failure_not_takes() -> None:
    records = simulate(cluster()[:4], plugins={"cards": broken("allocate", {"main": {CARD: ["card0"]}})})

    reason = records[0]["reason"]
    assert "kubegpu_scheduler_allocate: WrongAnswer: returned {'main'" in reason
    assert "take" not in reason


def test_an_allocation_its_own_take_refuses_is_allocates_failure_named_and_counted() -> None:
    """fit found room, allocate named a card the node lacks: the pod's reason blames the plugin's allocate (it read
    "device card9 does not exist on this node", as if the pod or the node were at fault), the failure is counted,
    and the other plugin's pod is scheduled."""
    built = manager(cards=broken("allocate", PluginAllocation(plugin="cards", containers={"main": {CARD: ["card9"]}})))
    built.register("gpus", Gpus())

    records = {r["pod"]: r for r in simulate(cluster()[:5], manager=built)}

    assert records["default/card-pod"]["reason"].startswith(
        "plugin 'cards' failed in kubegpu_scheduler_allocate: WrongAnswer: its own kubegpu_scheduler_take refused "
        "the allocation it answered (device card9 does not exist on this node)"
    )
    assert built.hook_failures[("cards", "kubegpu_scheduler_allocate")] == 1
    assert records["default/gpu-pod"]["event"] == "scheduled"


def test_a_plugin_whose_take_checks_nothing_never_gives_one_card_to_two_pods() -> None:
    """allocate always names card0 and take records it without looking (books that lose their holders): before,
    three pods were bound to card0 of one node. The engine refuses the second and third, naming the plugin, its
    allocate and the pod already holding the card, and counts the failure; the other plugin's pod is scheduled."""

    class Careless(Cards):
        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_allocate(self, state: Any, pod: Any) -> PluginAllocation:
            return PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}})

        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_take(self, state: Any, pod_key: str, allocation: PluginAllocation) -> Status:
            return Status.success()

    built = manager(cards=Careless(), gpus=Gpus())
    documents = [
        node_manifest("cards-0", labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}),
        node_manifest("gpus-0", labels={f"{OTHER}.count": "2"}, allocatable={OTHER: 2}),
        pod_manifest("a", {"main": {CARD: 1}}),
        pod_manifest("b", {"main": {CARD: 1}}),
        pod_manifest("gpu-pod", {"main": {OTHER: 1}}),
    ]

    records = {r["pod"]: r for r in simulate(documents, manager=built)}

    assert records["default/a"]["devices"] == {"main": {CARD: ["card0"]}}
    assert records["default/b"]["event"] == "unschedulable"
    assert records["default/b"]["reason"] == (
        "plugin 'cards' failed in kubegpu_scheduler_allocate: WrongAnswer: named cards.example/card device 'card0' "
        "for container main, which pod default/a already holds on this node; allocate must choose devices no other "
        "pod holds"
    )
    assert built.hook_failures[("cards", "kubegpu_scheduler_allocate")] == 1
    assert records["default/gpu-pod"]["event"] == "scheduled"


def test_the_guard_against_a_card_given_twice_follows_a_node_update_and_a_pods_departure() -> None:
    """The engine keeps per node the devices its pods hold (`NodeRecord.held`): a Node update (its pods held again
    on a new record) keeps them, so a second pod is still refused card0; the holder's deletion gives card0 back, so a
    third pod gets it."""

    class Careless(Cards):
        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_allocate(self, state: Any, pod: Any) -> PluginAllocation:
            return PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}})

        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_take(self, state: Any, pod_key: str, allocation: PluginAllocation) -> Status:
            return Status.success()

    labels = {f"{CARD}.count": "2"}
    engine = Engine(manager(cards=Careless()))
    engine.add_node(make_node("cards-0", labels=labels, allocatable={CARD: 2}))
    assert engine.schedule(make_pod("a", {"main": {CARD: 1}})).scheduled

    engine.add_node(make_node("cards-0", labels={**labels, "rack": "r1"}, allocatable={CARD: 2}))
    refused = engine.schedule(make_pod("b", {"main": {CARD: 1}}))
    assert not refused.scheduled
    assert "which pod default/a already holds on this node" in (refused.reason or "")

    engine.release("default/a")
    assert engine.nodes["cards-0"].held == {}, "nothing is kept of a pod gone (memory bounded by the pods there)"
    placed = engine.schedule(make_pod("c", {"main": {CARD: 1}}))
    assert placed.scheduled and placed.allocation is not None
    assert placed.allocation.containers == {"main": {CARD: ["card0"]}}


def test_a_shared_device_may_be_shared_again_but_never_held_whole_beside_a_share() -> None:
    """The guard against a device given twice reads `shares`: two pods sharing card0 are both placed (the plugin's
    books count the amounts), a third asking it whole is refused."""

    def share(container: str) -> PluginAllocation:
        return PluginAllocation(
            plugin="cards", containers={container: {CARD: ["card0"]}}, shares={container: {CARD: {"card0": 1}}}
        )

    class Sharing(Cards):
        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_allocate(self, state: Any, pod: Any) -> PluginAllocation:
            if pod.annotations.get("whole"):
                return PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}})
            return share("main")

        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_take(self, state: Any, pod_key: str, allocation: PluginAllocation) -> Status:
            return Status.success()

    documents = [
        node_manifest("cards-0", labels={f"{CARD}.count": "2"}, allocatable={CARD: 4}),
        pod_manifest("s1", {"main": {CARD: 1}}),
        pod_manifest("s2", {"main": {CARD: 1}}),
        pod_manifest("w", {"main": {CARD: 1}}, annotations={"whole": "yes"}),
    ]

    records = {r["pod"]: r for r in simulate(documents, manager=manager(cards=Sharing()))}

    assert [records[f"default/{p}"]["event"] for p in ("s1", "s2", "w")] == ["scheduled", "scheduled", "unschedulable"]
    assert "which pod default/s1 already holds on this node" in records["default/w"]["reason"]


def test_a_plugins_own_words_are_one_bounded_line_wherever_they_are_shown() -> None:
    """An exception whose text holds terminal escapes, a forged log line and 100,000 characters: the failure's
    message (a pod's reason, the log line of a node's build_node failure, which the simulator printed raw to stderr)
    is one line of escaped text, bounded; a load failure's too (`kubegpu plugins list`'s plain output)."""
    evil = "\x1b]0;pwned\x07\x1b[31m" + "A" * 100_000 + "\nFAKE LOG LINE"

    error = PluginHookError("cards", "kubegpu_scheduler_build_node", RuntimeError(evil), node="cards-0")
    built = manager()
    built._fail("cards", "load", f"ImportError: {evil}")

    for text in (str(error), str(built.failures[0])):
        assert "\x1b" not in text and "\x07" not in text and "\n" not in text
        assert "\\x1b]0;pwned" in text
        assert len(text) < 1200


def test_a_described_family_with_terminal_escapes_is_escaped_in_the_simulators_summary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin's `Occupancy.family` reached the report's SUMMARY line raw (the drawing above it was escaped): a
    terminal reading it was retitled and recoloured. Now it is escaped and bounded there too."""
    evil = "\x1b]0;pwned\x07\x1b[31m" + "F" * 5000

    class Loud(Cards):
        family = evil

    code, out, _ = _run_simulate(monkeypatch, tmp_path, capsys, Loud(), json_out=False)

    assert code == 0
    summary = out.split("SUMMARY", 1)[1]
    assert "\x1b" not in summary and "\x07" not in summary
    assert "\\x1b]0;pwned" in summary
    assert max(len(line) for line in summary.splitlines()) < 1300


def test_a_refusal_of_ten_thousand_reasons_costs_the_engine_no_more_than_one_of_a_few() -> None:
    """A plugin's `fit` answers a Status of 10,000 reasons: the engine counted every reason of every node's refusal
    for every pod (20 pods over 50 nodes took 12.6 s instead of 0.2 s, none of it in the hook, so no slow call was
    reported). A Status keeps at most `MAX_REASONS`, the last saying how many more there were, and the pods' reasons
    are as they were."""
    from kubegpu.core.status import MAX_REASONS

    many = Status.unschedulable(*[f"reason {i}" for i in range(10_000)], plugin="cards")
    assert len(many.reasons) == MAX_REASONS
    assert many.reasons[-1] == f"… ({10_000 - MAX_REASONS + 1} more reasons)"

    calls = 0

    class Wordy(Cards):
        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_fit(self, state: Any, pod: Any) -> Status:
            nonlocal calls
            calls += 1
            return many

    documents: list[dict[str, Any]] = [
        node_manifest(f"cards-{i}", labels={f"{CARD}.count": "2", "zone": str(i)}, allocatable={CARD: 2})
        for i in range(20)
    ]
    documents += [pod_manifest(f"p{i}", {"main": {CARD: 1}}) for i in range(10)]

    records = simulate(documents, plugins={"cards": Wordy()})

    assert {r["event"] for r in records} == {"unschedulable"}
    reason = records[0]["reason"]
    assert reason.startswith("0/20 nodes are available: 20 reason 0, 20 reason 1, 20 reason 10,")
    assert reason.endswith(f"20 … ({10_000 - MAX_REASONS + 1} more reasons).") and len(reason) <= 1024
    assert calls == 20  # each node asked once: the cost below is the engine's, not the hook's


def test_a_take_whose_refusal_names_another_plugin_still_blames_its_own() -> None:
    """A take that refuses with a Status naming another plugin (`plugin="gpus"`): the refusal was blamed on that
    plugin, which had nothing to do with the pod, and counted as its failure in allocate."""

    class Naming(Cards):
        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_take(self, state: Any, pod_key: str, allocation: PluginAllocation) -> Status:
            return Status.unschedulable("the card is busy", plugin="gpus")

    built = manager(cards=Naming())
    built.register("gpus", Gpus())

    records = {r["pod"]: r for r in simulate(cluster()[:5], manager=built)}

    assert records["default/card-pod"]["reason"].startswith("plugin 'cards' failed in kubegpu_scheduler_allocate")
    assert built.hook_failures == {("cards", "kubegpu_scheduler_allocate"): 1}
    assert records["default/gpu-pod"]["event"] == "scheduled"


@pytest.mark.parametrize("over", [-300, -194, -193, -100, 0, 1])
def test_an_allocation_is_bound_exactly_when_its_signed_annotations_fit_the_api_servers_limit(over: int) -> None:
    """A plugin's fields sized about the 256 KiB the API server allows for all of a pod's annotations (`over` bytes
    past it as the boundary measures the plugin's part alone). The pod's node, UID, stamp and signature come on top
    once merged and signed: the part passed at the boundary, was signed and bound, and the node side refused the
    allocation as too large (and the API server the annotations). Now what is written is measured whole: the pod is
    bound exactly when the API server takes its annotations and the node side reads them; else the plugin's allocate
    is named, and the card is held by nobody (a pod asking it next is placed)."""
    signing_key = b"k" * 32
    answer = PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": ""})
    part = json.dumps({"containers": answer.containers, "shares": {}, "plugins": {"cards": answer.fields}})
    pad = MAX_ANNOTATION_BYTES + over - len(part.replace(" ", ""))
    answer.fields["x"] = "y" * pad
    built = manager(cards=broken("allocate", answer))
    engine = Engine(built, signing_key=signing_key)
    engine.add_node(make_node("cards-0", labels={f"{CARD}.count": "1"}, allocatable={CARD: 1}))

    decision = engine.schedule(make_pod("card-pod", {"main": {CARD: 1}}))

    if decision.scheduled:
        written = sum(len(k) + len(v.encode()) for k, v in decision.annotations.items())
        assert written <= MAX_ANNOTATION_BYTES, "the API server refuses more"
        record = decode_allocation(decision.annotations["kubegpu.io/allocation"])  # the node side reads it
        assert verify_allocation(record, signing_key)
    else:
        assert over > -300, "a part well within the limit is bound"
        assert decision.reason.startswith("plugin 'cards' failed in kubegpu_scheduler_allocate: WrongAnswer:")
        assert str(MAX_ANNOTATION_BYTES) in decision.reason
        assert built.hook_failures[("cards", "kubegpu_scheduler_allocate")] == 1
        answer.fields["x"] = "y"
        assert engine.schedule(make_pod("next-pod", {"main": {CARD: 1}})).scheduled, "the card was left held"


def test_a_described_device_of_twenty_thousand_sharers_is_checked_in_bounded_time() -> None:
    """Each share a describe answer gives must be one of the cell's holders: looked up in the holders' list, a cell
    of 20,000 sharers took 1.7 s to check (every report, every node), 100 times one of 2,000. Now one pass."""
    import time

    holders = [f"tenant/pod-{i}" for i in range(20_000)]
    cell = DeviceCell(id="card0", holders=holders, used=1.0, shares=dict.fromkeys(holders, 1 / len(holders)))
    built = manager(cards=broken("describe", [Occupancy(family="cards", cells=[cell])]))

    began = time.perf_counter()
    [described] = built.call("cards", "kubegpu_scheduler_describe", state=None)
    took = time.perf_counter() - began

    assert described.cells[0].shares == cell.shares
    assert took < 0.3, f"{took:.2f} s to check one device's sharers"


def test_fields_the_engine_could_not_encode_cost_only_that_pod_and_hold_no_card() -> None:
    """A lone surrogate in a key of the plugin's fields: pydantic cannot encode it, and the engine raised out of
    `schedule` after the plugin's take, so the card stayed held by a pod never placed ("card0 is already held by
    default/a" for the next pod). Now refused at the boundary, naming the plugin; the card stays free."""
    answer = PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields={"x": {"\udc80": 1}})
    engine = Engine(manager(cards=broken("allocate", answer)))
    engine.add_node(make_node("cards-0", labels={f"{CARD}.count": "1"}, allocatable={CARD: 1}))

    refused = engine.schedule(make_pod("a", {"main": {CARD: 1}}))
    answer.fields["x"] = "fine"
    placed = engine.schedule(make_pod("b", {"main": {CARD: 1}}))

    assert not refused.scheduled and "plugin 'cards' failed in kubegpu_scheduler_allocate" in refused.reason
    assert "not UTF-8 (a lone surrogate)" in refused.reason
    assert placed.scheduled, placed.reason


def test_an_annotation_key_is_read_as_the_api_server_reads_it_in_lower_case() -> None:
    """The API server checks an annotation's key in lower case: `Example.COM/Card-Id` is taken, and was refused."""
    answer = PluginAllocation(
        plugin="cards", containers={"main": {CARD: ["card0"]}}, annotations={"Example.COM/Card-Id": "card0"}
    )
    [placed] = simulate(cluster()[:4], plugins={"cards": broken("allocate", answer)})
    assert placed["event"] == "scheduled", placed["reason"]
    assert placed["annotations"]["Example.COM/Card-Id"] == "card0"


@pytest.mark.parametrize("depth", range(26, 33))
def test_allocate_fields_are_refused_exactly_when_the_node_side_could_not_read_them(depth: int) -> None:
    """The node side's decoder is the oracle: fields it reads are bound with the pod; fields it would refuse (here
    nested too deep) are refused at the boundary, not signed, bound and then refused on the node."""
    fields = {"x": nested(depth)}
    answer = PluginAllocation(plugin="cards", containers={"main": {CARD: ["card0"]}}, fields=fields)
    record = AllocationRecord(
        version=1, node="cards-0", podUID="u", containers=answer.containers, plugins={"cards": fields}
    )
    try:
        decode_allocation(encode_allocation(record))
        readable = True
    except AnnotationError:
        readable = False

    [placed] = simulate(cluster()[:4], plugins={"cards": broken("allocate", answer)})

    assert (placed["event"] == "scheduled") is readable, placed["reason"]
    if not readable:
        assert (
            "kubegpu_scheduler_allocate: WrongAnswer: returned an allocation that cannot be written on the pod "
            in (placed["reason"])
        )


def test_an_allocation_under_another_name_is_renamed_to_the_entry_point_name() -> None:
    answer = PluginAllocation(plugin="typo", containers={"main": {CARD: ["card0"]}}, fields={"k": "v"})
    built = manager(cards=broken("allocate", answer))

    records = simulate(cluster()[:4], manager=built)

    assert records[0]["event"] == "scheduled"
    assert json.loads(records[0]["annotations"]["kubegpu.io/allocation"])["plugins"] == {"cards": {"k": "v"}}
    assert any("names its allocations 'typo'" in warning for warning in built.warnings)


# ------------------------------------------------------------------------------------------------------------
# The manager itself
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("amd.com/gpu", "returned the string 'amd.com/gpu'"),
        ({"amd.com/gpu": 1}, "a list of resource names is due"),
        (["ok.example/x", 3], "named 3 (int)"),
    ],
    ids=["string", "dict", "non-string"],
)
def test_a_resources_hook_answering_wrongly_leaves_the_plugin_out(answer: object, problem: str) -> None:
    built = manager(bad=broken("resources", answer), good=Gpus())

    assert built.names == ["good"]
    [failure] = built.failures
    assert (failure.name, failure.stage) == ("bad", "kubegpu_scheduler_resources")
    assert problem in failure.error
    assert built.owner_of("a") is None


class SharedGpus(Gpus):
    """GPUs with a share resource beside them, declared a qualifier of the GPUs (as nvidia's `gpucores`)."""

    resources = (OTHER, f"{OTHER}cores")
    qualifiers = {f"{OTHER}cores": OTHER}


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ([CARD], "a mapping of qualifying resource -> qualified resource is due"),
        ({CARD: CARD}, f"declared {CARD!r} a qualifier of itself"),
        ({CARD: OTHER}, f"declared {OTHER!r}, which it does not own"),
        ({f"{OTHER}cores": CARD}, f"declared {OTHER + 'cores'!r}, which it does not own"),
        ({CARD: 3}, "named 3 (int) among its qualifiers"),
    ],
    ids=["list", "itself", "another-plugins-device", "another-plugins-qualifier", "non-string"],
)
def test_a_qualifiers_hook_answering_wrongly_costs_only_that_plugins_declaration(answer: object, problem: str) -> None:
    """A plugin declares which of its resources are amounts of each device of another (kubegpu_scheduler_qualifiers),
    read once at start-up. A wrong answer (another plugin's resources included: a plugin must not make GPUs'
    compute count as its own cards' qualifier) is recorded as that plugin's failure: it keeps its resources and
    declares nothing, and the other plugins' declarations stand."""
    built = manager(bad=broken("qualifiers", answer), good=SharedGpus())

    assert built.names == ["bad", "good"]
    [failure] = built.failures
    assert (failure.name, failure.stage) == ("bad", "kubegpu_scheduler_qualifiers")
    assert problem in failure.error
    assert built.owner_of(CARD) == "bad"
    assert dict(built.qualifiers) == {f"{OTHER}cores": OTHER}


@pytest.mark.parametrize(
    ("marker", "words"),
    [
        ({"wrapper": True}, "wrapper=True"),
        ({"hookwrapper": True}, "hookwrapper=True"),
        ({"tryfirst": True}, "tryfirst=True"),
        ({"trylast": True}, "trylast=True"),
    ],
)
def test_wrappers_and_ordering_markers_are_refused_at_registration(marker: dict[str, bool], words: str) -> None:
    def fit(state: object, pod: object) -> Any:
        yield  # a wrapper's shape; never called

    module = type("M", (), {"kubegpu_scheduler_resources": staticmethod(scheduler_hooks.hookimpl(lambda: [CARD]))})
    module.kubegpu_scheduler_fit = staticmethod(scheduler_hooks.hookimpl(**marker)(fit))  # type: ignore[attr-defined]

    built = manager(bad=module())

    assert built.names == []
    [failure] = built.failures
    assert failure.stage == "register"
    assert words in failure.error and "kubegpu_scheduler_fit" in failure.error


def test_a_generator_hook_is_refused_at_registration() -> None:
    def score(self: Any, state: object, pod: object) -> Any:
        yield 100.0

    cls = type("Gen", (Cards,), {"kubegpu_scheduler_score": scheduler_hooks.hookimpl(score)})

    built = manager(gen=cls())

    assert built.names == []
    assert "generator function" in built.failures[0].error


def test_an_unknown_hook_name_raises_for_the_caller() -> None:
    built = manager(cards=Cards())

    with pytest.raises(ValueError, match=r"'kubegpu_scheduler_fitt' is not a hook of kubegpu\.scheduler"):
        built.call("cards", "kubegpu_scheduler_fitt", state=None, pod=None)


def test_prepare_is_computed_for_a_caller_that_does_not_give_it_and_once_per_signature_by_the_engine() -> None:
    calls: list[str] = []

    class Counting(Cards):
        @scheduler_hooks.hookimpl
        def kubegpu_scheduler_prepare(self, pod: Any) -> Any:
            calls.append(pod.name)
            return super().kubegpu_scheduler_prepare(pod)

    built = manager(cards=Counting())
    state = built.call("cards", "kubegpu_scheduler_build_node", node=make_node(labels={f"{CARD}.count": "2"}))
    assert built.call("cards", "kubegpu_scheduler_fit", state=state, pod=make_pod("p", {"main": {CARD: 1}})).ok
    assert calls == ["p"]

    calls.clear()
    engine = Engine(built)
    for i in range(3):
        engine.add_node(make_node(f"n{i}", labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}))
    for name in ("a", "b", "c"):
        assert engine.schedule(make_pod(name, {"main": {CARD: 1}})).scheduled
    assert calls == ["a"], "pods with one signature are prepared once"


def test_the_pod_signature_covers_labels_so_a_plugin_reading_them_gets_fresh_answers() -> None:
    class ByLabel(Cards):
        def read(self, pod: Any) -> Any:
            return pod.labels.get("tier")

        def eligible(self, state: Any, request: Any) -> tuple[int, str | None]:
            return (state.healthy, None) if request.extra == "gold" else (0, "only tier=gold pods use cards")

    engine = Engine(manager(cards=ByLabel()))
    engine.add_node(make_node("n0", labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}))
    silver = make_pod("s", {"main": {CARD: 1}})
    gold = replace(make_pod("g", {"main": {CARD: 1}}), labels={"tier": "gold"})

    assert not engine.schedule(silver).scheduled
    assert engine.schedule(gold).scheduled


# ------------------------------------------------------------------------------------------------------------
# Node side
# ------------------------------------------------------------------------------------------------------------


def device_plugin(**answers: object) -> object:
    hooks: dict[str, Callable[..., object]] = {"kubegpu_device_resources": lambda self: [CARD]}
    for hook, answer in answers.items():
        hooks[f"kubegpu_device_{hook}"] = lambda self, _a=answer: _a
    return type("Dev", (), {k: device_hooks.hookimpl(v) for k, v in hooks.items()})()


@pytest.mark.parametrize(
    ("hook", "answer", "kwargs", "problem"),
    [
        ("owned", ["FPGA_VISIBLE_DEVICES"], {}, "a DeviceOwnership or None is due"),
        ("discover", {"devices": []}, {"host_root": Path("/")}, "a DeviceInventory or None is due"),
        ("health", {"card0": "ok"}, {"host_root": Path("/"), "inventory": None}, "device id -> bool"),
        ("advertise", {"capacity": {}}, {"inventory": None}, "an Advertisement or None is due"),
        ("plugin_ids", {OTHER: {"0": True}}, {"inventory": None}, "does not own"),
        (
            "edit_container",
            "yes",
            {"allocation": None, "edit": ContainerEdit(), "dev_root": Path("/dev")},
            "True (edited) or None",
        ),
        (
            "edit_container",
            None,
            {
                "allocation": ContainerAllocation(pod_uid="u", node="n", container="c", resources={CARD: ["card0"]}),
                "edit": ContainerEdit(),
                "dev_root": Path("/dev"),
            },
            "True is due once the container has its devices",
        ),
    ],
    ids=["owned", "discover", "health", "advertise", "plugin-ids", "edit-not-bool", "edit-none-for-own"],
)
def test_a_device_hook_answering_wrongly_raises_naming_the_plugin_and_the_hook(
    hook: str, answer: object, kwargs: dict[str, Any], problem: str
) -> None:
    built = make_plugin_manager("device", plugins=[("dev", device_plugin(**{hook: answer}))], autoload=False)

    with pytest.raises(PluginHookError) as caught:
        built.call("dev", f"kubegpu_device_{hook}", **kwargs)

    assert str(caught.value).startswith(f"plugin 'dev' failed in kubegpu_device_{hook}: WrongAnswer:")
    assert problem in str(caught.value)


def test_an_inventory_under_another_name_is_published_under_the_entry_point_name() -> None:
    inventory = DeviceInventory(plugin="typo", devices=[DeviceInfo(id="card0")])
    built = make_plugin_manager("device", plugins=[("dev", device_plugin(discover=inventory))], autoload=False)

    assert built.call("dev", "kubegpu_device_discover", host_root=Path("/")).plugin == "dev"


def test_the_shim_refuses_a_container_whose_plugin_did_not_apply_its_own_allocation(tmp_path: Path) -> None:
    from kubegpu.crishim.testing import AllocationRefused, apply_allocation

    built = make_plugin_manager("device", plugins=[("dev", device_plugin(edit_container=None))], autoload=False)
    allocation = PluginAllocation(plugin="dev", containers={"main": {CARD: ["card0"]}})

    with pytest.raises(AllocationRefused) as caught:
        apply_allocation(built, allocation, dev_root=tmp_path)

    assert "plugin 'dev' failed in kubegpu_device_edit_container: WrongAnswer: returned None" in str(caught.value)


def test_the_advertiser_skips_a_plugin_whose_discovery_answers_wrongly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kubegpu.crishim.testing import advertise

    built = make_plugin_manager("device", plugins=[("dev", device_plugin(discover={"card0": {}}))], autoload=False)

    manifest = advertise(built, tmp_path)

    assert "kubegpu.io/devices" not in manifest["metadata"]["annotations"]
    assert any("plugin 'dev' failed in kubegpu_device_discover: WrongAnswer" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cards.example/model", "x" * 64),
        ("cards.example/model", "\x1b[31mred"),
        ("cards.example/model", "-leading-dash"),
        ("Cards.Example/model", "a"),
        ("/model", "a"),
        ("cards.example/" + "n" * 64, "a"),
    ],
    ids=["value-too-long", "value-escape", "value-dash", "prefix-upper-case", "empty-prefix", "name-too-long"],
)
def test_a_label_the_api_server_refuses_costs_only_its_plugins_advertisement(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str, value: str
) -> None:
    """The advertiser patches every plugin's labels with the node's `kubegpu.io/devices` annotation in one request:
    one label the API server refuses (a value over 63 characters, a key out of syntax) failed that whole patch, and
    every plugin's inventory on the node went stale. Now that label is the plugin's wrong answer: its advertisement is
    skipped and logged naming it; the other plugin's inventory, labels and capacity are published."""
    from kubegpu.crishim.testing import advertise

    def inventory(name: str) -> DeviceInventory:
        return DeviceInventory(plugin=name, devices=[DeviceInfo(id="card0")])

    class Good:
        @device_hooks.hookimpl
        def kubegpu_device_resources(self) -> list[str]:
            return [OTHER]

        @device_hooks.hookimpl
        def kubegpu_device_discover(self) -> DeviceInventory:
            return inventory("good")

        @device_hooks.hookimpl
        def kubegpu_device_advertise(self) -> Advertisement:
            return Advertisement(capacity={OTHER: 1}, labels={"other.example/gpu.count": "1", "other.example/e": ""})

    loud = device_plugin(discover=inventory("dev"), advertise=Advertisement(capacity={CARD: 1}, labels={key: value}))
    built = make_plugin_manager("device", plugins=[("dev", loud), ("good", Good())], autoload=False)

    manifest = advertise(built, tmp_path)

    assert manifest["metadata"]["labels"] == {"other.example/gpu.count": "1", "other.example/e": ""}
    assert manifest["status"]["capacity"][OTHER] == "1" and CARD not in manifest["status"]["capacity"]
    assert "good" in json.loads(manifest["metadata"]["annotations"]["kubegpu.io/devices"])["inventories"]
    assert any(
        "plugin 'dev' failed in kubegpu_device_advertise: WrongAnswer: advertised the label" in r.getMessage()
        and "which the API server refuses" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("answer", ["soon", True, 1.5])
def test_a_wrong_fragmentation_epoch_is_logged_naming_the_hook_and_pods_still_schedule(
    caplog: pytest.LogCaptureFixture, answer: object
) -> None:
    """An epoch that is not a whole number cannot key a memo: the engine logs the plugin and the hook, measures
    against the node alone, and the pod is placed."""

    def fragmentation(self: Any) -> float:
        return 0.0

    def epoch(self: Any) -> object:
        return answer

    cls = type(
        "Epochs",
        (Cards,),
        {
            "kubegpu_scheduler_fragmentation": scheduler_hooks.hookimpl(fragmentation),
            "kubegpu_scheduler_fragmentation_epoch": scheduler_hooks.hookimpl(epoch),
        },
    )
    caplog.set_level(logging.ERROR)
    engine = Engine(manager(cards=cls()))
    for name in ("cards-0", "cards-1"):
        engine.add_node(make_node(name, labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}))
    assert engine.schedule(make_pod("p", {"main": {CARD: 1}})).scheduled
    told = [r.getMessage() for r in caplog.records]
    assert any("plugin 'cards' failed" in t and "kubegpu_scheduler_fragmentation_epoch" in t for t in told), told
