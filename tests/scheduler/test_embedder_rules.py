"""An embedder's own rules (`Engine(filters=..., score_plugins=..., pre_enqueue=...)`) that fail: a rule that
raises, `SystemExit` included (a library that exits on a bad setting), costs only the pod it was asked about, which is
refused with a reason naming the rule; every other pod is scheduled, and the process goes on serving. The rules a
plugin adds (`kubegpu_scheduler_rules`) and an embedder's Permit rules are guarded alike (test_plugin_rules.py,
test_gangs.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.status import Status
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine

from .test_queue_plugins import bare_engine
from .test_scheduling_gates import bindings, gated
from .test_service_guards import RecordingWriter, schedule_all

GPU = "nvidia.com/gpu"
FAILURES = [RuntimeError("the policy service is down"), SystemExit(2), KeyError("team")]
IDS = ["raises", "system-exit", "key-error"]


def doomed(pod: PodRequest) -> bool:
    return pod.labels.get("doom") == "yes"


class Failing:
    """A rule of every kind that fails for pods labelled `doom: yes` with `failure`, and lets the others through."""

    reads_usage = False
    local = True

    def __init__(self, name: str, failure: BaseException) -> None:
        self.name, self.failure = name, failure

    def _check(self, pod: PodRequest) -> None:
        if doomed(pod):
            raise self.failure

    # NodeFilter
    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: Any, record: Any, pod: PodRequest, plan: Any) -> Status | None:
        self._check(pod)
        return None

    # ScorePlugin
    def matters(self, engine: Any, pod: PodRequest, plan: Any) -> bool:
        self._check(pod)
        return True

    def prescore(self, engine: Any, pod: PodRequest, plan: Any) -> object | None:
        self._check(pod)
        return True

    def score(self, engine: Any, state: object, records: Sequence[Any], pod: PodRequest, plan: Any) -> list[float]:
        self._check(pod)
        return [0.0] * len(records)

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return raw

    # PreEnqueuePlugin
    def pre_enqueue(self, pod: PodRequest) -> Status | None:
        self._check(pod)
        return None


def engine(**rules: Any) -> Engine:
    plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    e = Engine(plugins, **rules)
    for i in range(2):
        e.add_node(node_info(node_manifest(f"n{i}", allocatable={GPU: 8})))
    return e


def pod(name: str, doom: bool) -> PodRequest:
    manifest = pod_manifest(name, {"main": {GPU: 1}})
    manifest["metadata"]["labels"] = {"doom": "yes" if doom else "no"}
    return pod_request(manifest)[0]


@pytest.mark.parametrize("failure", FAILURES, ids=IDS)
def test_a_filter_that_fails_refuses_its_pod_naming_the_rule_and_the_others_are_scheduled(
    failure: BaseException,
) -> None:
    e = engine(filters=[Failing("TenantPolicy", failure)])
    refused = e.schedule(pod("a", doom=True))
    assert not refused.scheduled and "TenantPolicy" in (refused.reason or ""), refused.reason
    assert e.schedule(pod("b", doom=False)).scheduled


@pytest.mark.parametrize("failure", FAILURES, ids=IDS)
def test_a_score_plugin_that_fails_scores_nothing_and_its_pod_is_still_scheduled(failure: BaseException) -> None:
    e = engine(score_plugins=[Failing("CostScore", failure)])
    assert e.schedule(pod("a", doom=True)).scheduled
    assert e.schedule(pod("b", doom=False)).scheduled


@pytest.mark.parametrize("failure", FAILURES, ids=IDS)
def test_a_pre_enqueue_rule_that_fails_keeps_its_pod_out_with_a_reason_naming_the_rule(
    failure: BaseException,
) -> None:
    e = engine(pre_enqueue=[Failing("QuotaGate", failure)])
    refusal = e.pre_enqueue(pod("a", doom=True))
    assert refusal is not None and "QuotaGate" in refusal.message, refusal
    assert e.pre_enqueue(pod("b", doom=False)) is None


@pytest.mark.parametrize("kind", ["filters", "score_plugins", "pre_enqueue"])
def test_the_scheduler_serves_on_when_an_embedders_rule_exits(kind: str) -> None:
    """The custom scheduler with an embedder's rule that calls `sys.exit` for one pod: before, the `SystemExit`
    ended its loop (the mirror's guard catches `Exception`); now that pod alone is refused or kept out, told why,
    and the next pod is bound."""
    service = CustomScheduler(
        None, RecordingWriter(), bare_engine(**{kind: [Failing("Exiting", SystemExit(3))]}), name="kubegpu"
    )  # type: ignore[arg-type]
    service.mirror.on_nodes("SYNC", [node_manifest("n1", cpu="8")])
    service.mirror.on_pods("SYNC", [])
    for name, doom in (("poison", "yes"), ("fine", "no")):
        manifest = gated(name, [])
        manifest["metadata"]["labels"] = {"doom": doom}
        service.mirror.on_pods("ADDED", manifest)
    schedule_all(service)
    expected = ["fine", "poison"] if kind == "score_plugins" else ["fine"]
    assert sorted(bindings(service)) == expected
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    told = [json.dumps(body) for _, path, body in writer.writes if path.endswith("/events")]
    if kind != "score_plugins":
        assert any("poison" in event and "Exiting" in event for event in told), told


class Answering(Failing):
    """A score plugin whose raw score of the first node is `first` (0 elsewhere), normalized as it is."""

    def __init__(self, first: object) -> None:
        super().__init__("CostScore", RuntimeError("unused"))
        self.first = first

    def score(self, engine: Any, state: object, records: Sequence[Any], pod: PodRequest, plan: Any) -> list[float]:
        return [self.first, *[0.0] * (len(records) - 1)]  # type: ignore[list-item]


@pytest.mark.parametrize("first", [None, "high", float("nan"), float("inf"), True], ids=repr)
def test_a_score_plugin_answering_no_finite_number_scores_nothing_and_is_counted(first: object) -> None:
    """A score of None or a string (a lookup that found nothing) ended `Engine.schedule` with a TypeError comparing
    it with the other nodes' scores; NaN and infinity silently decided the node. Now the plugin's answer is wrong:
    it is counted, scores every node 0, and the pod is scheduled."""
    e = engine(score_plugins=[Answering(first)])
    assert e.schedule(pod("a", doom=False)).scheduled
    assert e.plugins.hook_failures[("embedder", "rule CostScore (score)")] >= 1, first
