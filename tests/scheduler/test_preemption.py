"""Priority and device-aware preemption: what a user sees when an important pod finds the cluster full.

The engine decides (`Engine.preempt`), the simulator applies it at once; the same rules serve the custom scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import LabelSelector, PodRequest, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.preemption import Budget, Candidate, pick, split_by_budget

DEVICE = neuron.NEURONDEVICE
TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}


def trn1(name: str) -> dict[str, Any]:
    return node_manifest(name, labels={**TRN1, "kubernetes.io/hostname": name}, allocatable={DEVICE: 16})


def pod_doc(name: str, devices: int, priority: int = 0, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {DEVICE: str(devices)}}}],
        "priority": priority,
        **extra.pop("spec", {}),
    }
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default", **extra}, "spec": spec}


def pod(name: str, devices: int, priority: int = 0, **extra: Any) -> PodRequest:
    return pod_request(pod_doc(name, devices, priority, **extra))[0]


def engine(*names: str) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    for name in names:
        e.add_node(node_info(trn1(name)))
    return e


def test_a_high_priority_pod_evicts_the_low_priority_pods_filling_a_trn1() -> None:
    e = engine("trn-0")
    for i in range(4):
        assert e.schedule(pod(f"low-{i}", 4)).scheduled
    big = pod("big", 16, priority=1000)
    assert not e.schedule(big).scheduled
    preemption = e.preempt(big)
    assert preemption.node == "trn-0"
    assert sorted(preemption.victims) == [f"default/low-{i}" for i in range(4)]
    assert len(e.pods) == 4  # a what-if: nothing changed
    for key in preemption.victims:
        e.release(key)
    decision = e.reserve(big, "trn-0")
    assert decision.allocation is not None
    assert decision.allocation.containers["main"][DEVICE] == [str(i) for i in range(16)]


def test_an_eight_device_pod_evicts_only_the_lower_priority_of_two_holders() -> None:
    e = engine("trn-0")
    assert e.schedule(pod("keep", 8, priority=500)).scheduled
    assert e.schedule(pod("lose", 8, priority=10)).scheduled
    preemption = e.preempt(pod("new", 8, priority=100))
    assert preemption.victims == ("default/lose",)


def test_victims_are_reprieved_when_the_devices_they_hold_are_not_needed() -> None:
    e = engine("trn-0")
    for name in ("a", "b", "c"):
        assert e.schedule(pod(name, 4)).scheduled  # rows 0..2; row 3 free
    preemption = e.preempt(pod("half", 8, priority=5))
    # the free row and one more row of the same half suffice: one victim, not two
    assert len(preemption.victims) == 1


def test_equal_priority_and_preemption_policy_never_preempt_nothing() -> None:
    e = engine("trn-0")
    assert e.schedule(pod("holder", 16, priority=100)).scheduled
    assert e.preempt(pod("peer", 16, priority=100)).node is None
    never = pod("polite", 16, priority=1000, spec={"preemptionPolicy": "Never"})
    refused = e.preempt(never)
    assert refused.node is None and refused.reason == "the pod's preemptionPolicy is Never"


def test_a_disruption_budget_steers_preemption_to_the_unprotected_node() -> None:
    e = engine("trn-0", "trn-1")
    assert e.schedule(pod("guarded", 16, labels={"app": "db"})).node is not None
    assert e.schedule(pod("free", 16, labels={"app": "batch"})).node is not None
    budget = Budget("default", "db", LabelSelector((Requirement("app", "In", ("db",)),)), allowed=0)
    preemption = e.preempt(pod("urgent", 16, priority=10), [budget])
    assert preemption.victims == ("default/free",) and preemption.violations == 0


def test_a_violating_eviction_is_still_chosen_when_nothing_else_helps() -> None:
    e = engine("trn-0")
    assert e.schedule(pod("guarded", 16, labels={"app": "db"})).scheduled
    budget = Budget("default", "db", LabelSelector((Requirement("app", "In", ("db",)),)), allowed=0)
    preemption = e.preempt(pod("urgent", 16, priority=10), [budget])
    assert preemption.victims == ("default/guarded",) and preemption.violations == 1


def low(priority: int, start: str = "") -> PodRequest:
    return PodRequest("ns", f"p{priority}{start}", "uid", (), priority=priority, start_time=start or None)


@pytest.mark.parametrize(
    ("candidates", "chosen"),
    [
        ([Candidate("a", (low(1),), 1), Candidate("b", (low(5), low(6)), 0)], "b"),
        ([Candidate("a", (low(9),), 0), Candidate("b", (low(5), low(6)), 0)], "b"),
        ([Candidate("a", (low(5), low(5)), 0), Candidate("b", (low(5), low(1)), 0)], "b"),
        ([Candidate("a", (low(5), low(-3)), 0), Candidate("b", (low(5),), 0)], "b"),
        ([Candidate("a", (low(5, "2024-01-01"),), 0), Candidate("b", (low(5, "2025-01-01"),), 0)], "b"),
        ([Candidate("a", (low(5),), 0), Candidate("b", (low(5),), 0)], "a"),
    ],
    ids=[
        "fewest-budget-violations",
        "lowest-highest-priority",
        "smallest-priority-sum",
        "fewest-victims",
        "latest-start",
        "first",
    ],
)
def test_the_node_is_chosen_as_default_preemption_chooses(candidates: list[Candidate], chosen: str) -> None:
    found = pick(candidates)
    assert found is not None and found.node == chosen


def test_budgets_count_down_per_selected_pod() -> None:
    selector = LabelSelector((Requirement("app", "In", ("db",)),))
    pods = [PodRequest("ns", f"db-{i}", str(i), (), labels={"app": "db"}) for i in range(3)]
    violating, others = split_by_budget(pods, [Budget("ns", "b", selector, allowed=1)])
    assert [p.name for p in others] == ["db-0"] and [p.name for p in violating] == ["db-1", "db-2"]
    assert split_by_budget(pods, [Budget("ns", "b", LabelSelector(()), allowed=0)]) == ([], pods)


def run_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str], documents: list[dict[str, Any]]) -> list[Any]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    assert main(["simulate", "--json", str(path)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_simulate_reports_each_victim_before_the_preemptor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running = [pod_doc(f"low-{i}", 8, spec={"nodeName": "trn-0"}) for i in range(2)]  # already bound
    documents = [trn1("trn-0"), *running, pod_doc("big", 16, priority=1000)]
    events = run_simulate(tmp_path, capsys, documents)
    assert [(e["event"], e["pod"]) for e in events] == [
        ("scheduled", "default/low-0"),
        ("scheduled", "default/low-1"),
        ("preempted", "default/low-0"),
        ("preempted", "default/low-1"),
        ("scheduled", "default/big"),
    ]
    assert all(e["by"] == "default/big" and e["node"] == "trn-0" for e in events[2:4])


def test_simulate_orders_arrivals_by_priority_and_resolves_priority_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    classes = [
        {"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 100},
        {"kind": "PriorityClass", "metadata": {"name": "default"}, "value": 5, "globalDefault": True},
    ]
    documents = [trn1("trn-0"), *classes, pod_doc("plain", 16), pod_doc("vip", 16, spec={"priorityClassName": "high"})]
    events = run_simulate(tmp_path, capsys, documents)
    assert [(e["event"], e["pod"]) for e in events] == [
        ("scheduled", "default/vip"),
        ("unschedulable", "default/plain"),
    ]


def test_simulate_honours_disruption_budgets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budget = {
        "kind": "PodDisruptionBudget",
        "apiVersion": "policy/v1beta1",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }
    documents = [trn1("trn-0"), trn1("trn-1"), budget]
    documents += [pod_doc("db", 16, labels={"app": "db"}), pod_doc("batch", 16, labels={"app": "batch"})]
    documents.append(
        {"kind": "Pod", "metadata": {"name": "gone", "deletionTimestamp": "x"}, "spec": {"containers": [{"name": "m"}]}}
    )
    documents.append(pod_doc("urgent", 16, priority=10))
    events = run_simulate(tmp_path, capsys, documents)
    preempted = [e["pod"] for e in events if e["event"] == "preempted"]
    assert preempted == ["default/batch"]
    assert events[-1]["event"] == "scheduled" and events[-1]["pod"] == "default/urgent"


@pytest.mark.parametrize(
    ("percent", "error"),
    [
        ("²%", "PodDisruptionBudget.spec.minAvailable: '²%' is neither a count nor a percentage"),
        ("1" + "0" * 400 + "%", "PodDisruptionBudget.spec.minAvailable: a percentage over 100 ('1000000000"),
        ("0" * 5000 + "1%", None),  # 1 %, as the API server reads it (the 5000 digits were past what int() reads)
    ],
    ids=["superscript", "400-digits", "leading-zeros"],
)
def test_a_budgets_percentage_is_read_when_the_file_is_or_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], percent: str, error: str | None
) -> None:
    """A percentage the disruption arithmetic could not read raised out of the run at the first preemption (a
    ValueError, or this field's own error, with a traceback); a percentage of 400 digits overflowed the float."""
    budget = {
        "kind": "PodDisruptionBudget",
        "apiVersion": "policy/v1",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": percent, "selector": {"matchLabels": {"app": "db"}}},
    }
    documents = [trn1("trn-0"), trn1("trn-1"), budget]
    documents.append(pod_doc("db", 16, labels={"app": "db"}, spec={"nodeName": "trn-0"}))  # running already
    documents.append(pod_doc("batch", 16, labels={"app": "batch"}, spec={"nodeName": "trn-1"}))
    documents.append(pod_doc("urgent", 16, priority=10))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code = main(["simulate", "--json", str(path)])
    out, err = capsys.readouterr()
    if error is None:  # 1 % of one pod, rounded up: the budget keeps db, batch makes room
        assert code == 0
        assert [json.loads(line)["pod"] for line in out.splitlines() if '"preempted"' in line] == ["default/batch"]
    else:
        assert code == 2 and error in err and len(err) < 400
