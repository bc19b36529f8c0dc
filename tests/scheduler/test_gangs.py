"""Gangs, as a user meets them: a training job placed whole in one rack (or not at all), two jobs competing for
the same racks, a job whose members arrive slowly, and a high-priority job that needs a rack others hold.

The engine's side (`Engine.place_gang`, `permit`, `preempt_gang`); the simulator's in `test_simulate_gangs.py`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import ManifestError, node_info, pod_request
from kubegpu.core.models import LabelSelector, PodRequest, Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import gangfit
from kubegpu.scheduler.engine import Engine, PermitCode, Verdict
from kubegpu.scheduler.podgroups import (
    CLIQUE,
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL,
    POD_GROUP_LABEL,
    PREFERRED_TOPOLOGY,
    REQUIRED_TOPOLOGY,
    PodGroup,
    kueue_group,
    member_index,
    pod_group,
    topology_levels,
)
from kubegpu.scheduler.preemption import Budget

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"
BLOCK = "example.com/block"


def engine(racks: list[int], *, levels: tuple[str, ...] | None = (RACK,), label: str = RACK, gpus: int = 8) -> Engine:
    """Racks of 8-GPU nodes: `racks[r]` nodes in rack r, named r{r}-n{i}."""
    e = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), levels=levels)
    for r, count in enumerate(racks):
        for i in range(count):
            name = f"r{r}-n{i}"
            labels = {label: f"rack-{r}", "kubernetes.io/hostname": name, BLOCK: f"block-{r // 2}"}
            e.add_node(node_info(node_manifest(name, labels=labels, allocatable={GPU: gpus})))
    return e


def member(
    gang: str,
    index: int,
    *,
    gpus: int = 8,
    total: int | None = None,
    priority: int = 0,
    annotations: Mapping[str, str] | None = None,
    coscheduling: bool = False,
) -> PodRequest:
    document = pod_manifest(f"{gang}-{index}", {"main": {GPU: gpus}}, annotations=dict(annotations or {}))
    labels = {"batch.kubernetes.io/job-completion-index": str(index)}
    if coscheduling:
        labels[POD_GROUP_LABEL] = gang
    else:
        labels[KUEUE_GROUP_LABEL] = gang
        document["metadata"]["annotations"][KUEUE_TOTAL] = str(total)
    document["metadata"]["labels"] = labels
    document["spec"]["priority"] = priority
    return pod_request(document)[0]


def gang(name: str, size: int, **kwargs: Any) -> list[PodRequest]:
    return [member(name, i, total=size, **kwargs) for i in range(size)]


def required(label: str = RACK) -> dict[str, str]:
    return {REQUIRED_TOPOLOGY: label}


def racks_of(e: Engine, keys: list[str]) -> Counter[str]:
    return Counter(e.placement(key).node.split("-")[0] for key in keys)  # type: ignore[union-attr]


# -- the shapes users write ------------------------------------------------------------------------------------------


def podgroup_document(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train-7", "namespace": "ml", "annotations": required()},
        "spec": spec,
    }


def test_a_scheduler_plugins_podgroup_is_read_as_written() -> None:
    group = pod_group(podgroup_document(minMember=16, scheduleTimeoutSeconds=30, minResources={"cpu": "1500m"}))
    assert (group.key, group.min_member, group.timeout_seconds) == ("ml/train-7", 16, 30)
    assert group.min_resources == {"cpu": 1500}
    assert group.required == RACK


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"minMember": 0}, "PodGroup.spec.minMember: 0 is out of range"),
        ({"minMember": "16"}, "PodGroup.spec.minMember: expected an integer"),
        ({"minMember": 10**9}, "PodGroup.spec.minMember: 1000000000 is out of range"),
        ({"minMember": 2, "scheduleTimeoutSeconds": -1}, "PodGroup.spec.scheduleTimeoutSeconds: -1 is out of range"),
        ({"minMember": 2, "minResources": {"cpu": "lots"}}, "PodGroup.spec.minResources[cpu]"),
        ({"minMember": 2, "minResources": ["cpu"]}, "PodGroup.spec.minResources: expected a mapping"),
    ],
    ids=["zero", "string", "huge", "negative-timeout", "bad-quantity", "not-a-mapping"],
)
def test_a_malformed_podgroup_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ManifestError, match=r"^" + field.replace("[", r"\[").replace("]", r"\]")):
        pod_group(podgroup_document(**spec))


def test_a_podgroup_asking_for_two_topologies_or_a_bad_label_is_refused() -> None:
    document = podgroup_document(minMember=2)
    document["metadata"]["annotations"] = {REQUIRED_TOPOLOGY: RACK, PREFERRED_TOPOLOGY: RACK}
    with pytest.raises(ManifestError, match="both set"):
        pod_group(document)
    document["metadata"]["annotations"] = {REQUIRED_TOPOLOGY: "not a label\x1b[31m"}
    with pytest.raises(ManifestError, match=r"podset-required-topology\]: .* is not a node label key") as raised:
        pod_group(document)
    assert "\x1b" not in str(raised.value)


def test_kueue_members_describe_their_gang_and_their_rank() -> None:
    pod = member("job", 3, total=4, annotations={PREFERRED_TOPOLOGY: CLIQUE})
    group = kueue_group(pod)
    assert group is not None and (group.key, group.min_member, group.preferred) == ("default/job", 4, CLIQUE)
    assert member_index(pod) == 3
    bad = member("job", 0, total=4)
    bad = PodRequest(**{**bad.__dict__, "annotations": {KUEUE_TOTAL: "four"}}) if False else bad
    document = pod_manifest("lone", {"main": {GPU: 1}})
    document["metadata"]["labels"] = {KUEUE_GROUP_LABEL: "job"}
    with pytest.raises(ManifestError, match=r"annotations\[kueue.x-k8s.io/pod-group-total-count\]: required"):
        kueue_group(pod_request(document)[0])
    document["metadata"]["annotations"] = {KUEUE_TOTAL: "99999999999"}
    with pytest.raises(ManifestError, match="pod-group-total-count"):
        kueue_group(pod_request(document)[0])


def test_a_kueue_topology_gives_the_levels_widest_first() -> None:
    document = {
        "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]}
    }
    assert topology_levels(document) == (BLOCK, RACK, "kubernetes.io/hostname")
    with pytest.raises(ManifestError, match=r"Topology.spec.levels\[1\].nodeLabel: .* is named twice"):
        topology_levels({"spec": {"levels": [{"nodeLabel": RACK}, {"nodeLabel": RACK}]}})


# -- all or nothing, best fit, rank by rank ----------------------------------------------------------------------


def test_a_four_node_gang_leaves_the_only_free_sixteen_node_rack_whole() -> None:
    e = engine([16, 6, 4])
    placed = e.place_gang(gang("small", 4))
    assert placed.placed and (placed.level, placed.domain) == (RACK, "rack-2")
    big = e.place_gang(gang("big", 16, annotations=required()))
    assert big.placed and big.domain == "rack-0"


def test_neighbouring_ranks_are_neighbours() -> None:
    e = engine([4, 4, 4], levels=(BLOCK, RACK))
    members = gang("ranks", 8)[::-1]  # arrive in any order
    placed = e.place_gang(members)
    assert placed.placed
    nodes = [d.node for d in placed.decisions]
    assert [d.pod for d in placed.decisions] == [f"default/ranks-{i}" for i in range(8)]
    assert nodes[:4] == [f"r0-n{i}" for i in range(4)] and nodes[4:] == [f"r1-n{i}" for i in range(4)]


def test_a_gang_that_fits_no_rack_holds_nothing_and_says_why() -> None:
    e = engine([12, 8, 4])
    placed = e.place_gang(gang("train-7", 16, annotations=required()))
    assert not placed.placed
    assert placed.reason == (
        "gang default/train-7: 16 members need 8 nvidia.com/gpu each; the largest rack (rack-0) has 12 such nodes free"
    )
    assert all(not d.scheduled and d.reason == placed.reason for d in placed.decisions)
    assert not e.pod_keys()


def test_two_gangs_competing_for_one_rack_never_both_hold_part() -> None:
    e = engine([8, 3])
    first = e.place_gang(gang("a", 6, annotations=required()))
    second = e.place_gang(gang("b", 6, annotations=required()))
    assert first.placed and not second.placed
    assert len(e.pod_keys()) == 6 and all(key.startswith("default/a-") for key in e.pod_keys())


def test_members_already_holding_places_count_and_stay() -> None:
    e = engine([4])
    members = gang("g", 4)
    assert e.place_gang(members[:2], kueue_group(members[0])).placed is False  # 2 of 4: waits, holds nothing
    assert not e.pod_keys()
    first = e.place_gang(members)
    again = e.place_gang(members)
    assert again.placed and [d.node for d in again.decisions] == [d.node for d in first.decisions]


def test_nvlink_cliques_and_aws_layers_are_levels_with_no_configuration() -> None:
    e = engine([2, 4], levels=None, label=CLIQUE)
    placed = e.place_gang(gang("nvl", 2, annotations=required(CLIQUE)))
    assert placed.placed and (placed.level, placed.domain) == (CLIQUE, "rack-0")
    aws = "topology.k8s.aws/network-node-layer-3"
    e = engine([3, 5], levels=None, label=aws)
    assert e.topology_levels() == (aws,)
    placed = e.place_gang(gang("efa", 4))
    assert placed.placed and placed.domain == "rack-1"


def test_a_gang_member_with_a_malformed_group_is_refused_naming_the_field() -> None:
    e = engine([2])
    bad = member("g", 0, total=2, annotations={REQUIRED_TOPOLOGY: RACK, PREFERRED_TOPOLOGY: RACK})
    placed = e.place_gang([bad, member("g", 1, total=2)])
    assert not placed.placed and "both set" in (placed.reason or "")


# -- Permit ------------------------------------------------------------------------------------------------------


def test_members_wait_at_permit_until_the_gang_is_complete_then_all_are_approved() -> None:
    e = engine([4])
    members = gang("slow", 3)
    answers = []
    for pod in members:
        assert e.schedule(pod).scheduled
        answers.append(e.permit(pod, now=100.0))
    assert [a.code for a in answers] == [PermitCode.WAIT, PermitCode.WAIT, PermitCode.APPROVE]
    assert answers[0].deadline == 160.0 and "1 of minMember 3 members hold places" in (answers[0].reason or "")
    assert set(answers[2].approved) == {"default/slow-0", "default/slow-1"}
    assert not e.waiting_pods()


def _permit_seconds(members: int, min_member: int) -> float:
    """CPU seconds of Permit for every member of a gang of `members` 1-GPU pods that `place_gang` placed at once
    (the custom scheduler's loop), minMember `min_member`."""
    from time import process_time

    e = engine([10] * 64)
    group = PodGroup("default", "big", min_member)
    pods = gang("big", members, gpus=1)
    assert e.place_gang(pods, group, partial=True).placed
    e.set_pod_group(group)
    started = process_time()
    codes = {e.permit(pod, now=0.0).code for pod in pods}
    elapsed = process_time() - started
    assert codes == ({PermitCode.APPROVE} if members >= min_member else {PermitCode.WAIT})
    return elapsed


@pytest.mark.parametrize("complete", [True, False], ids=["approved", "waiting"])
def test_permit_for_every_member_of_a_gang_of_thousands_costs_time_linear_in_its_members(complete: bool) -> None:
    # 2,000 members took 4.7 s (approved) and 3.3 s (waiting) of Permit, 4,000 took 21 s and 18 s: every member
    # listed the gang's holders (and the waiting pods) again. Both sizes measured side by side: 4x the members
    # may cost about 4x, never the 16x of a pass over the gang per member.
    small, large = 500, 2000
    few = min(_permit_seconds(small, small if complete else 5000) for _ in range(2))
    many = _permit_seconds(large, large if complete else 5000)
    assert many < 8 * max(few, 0.01), f"{small} members: {few:.3f} s, {large} members: {many:.3f} s"


def test_the_gang_holders_remembered_equal_those_listed_afresh() -> None:
    e = engine([2, 2])
    groups = [PodGroup("default", name, 3) for name in ("a", "b")]
    members = {group.name: gang(group.name, 3, gpus=4) for group in groups}
    story = [("a", 0, True), ("b", 0, True), ("a", 1, True), ("a", 0, False), ("b", 1, True), ("a", 2, True)]
    for name, index, place in story:
        pod = members[name][index]
        if place:
            assert e.schedule(pod).scheduled
        else:
            e.release(pod.key)
        remembered = [e.gang_holders(group) for group in groups]
        e.forget_memos()
        assert remembered == [e.gang_holders(group) for group in groups]


def test_a_gang_whose_members_arrive_too_slowly_releases_on_its_timeout() -> None:
    e = engine([4])
    members = gang("late", 3)
    for pod in members[:2]:
        assert e.schedule(pod).scheduled
        assert e.permit(pod, now=0.0).code is PermitCode.WAIT
    assert e.expire(59.0) == []
    expired = e.expire(60.0)
    assert sorted(w.pod.key for w in expired) == ["default/late-0", "default/late-1"]
    assert not e.pod_keys() and not e.waiting_pods()
    assert e.reject_waiting("default/late-0") is None  # idempotent


def test_while_one_gang_is_partly_held_a_second_gang_is_refused_not_left_waiting() -> None:
    e = engine([4])
    a, b = gang("a", 3), gang("b", 3)
    assert e.schedule(a[0]).scheduled and e.permit(a[0], now=0).code is PermitCode.WAIT
    assert e.schedule(b[0]).scheduled
    refused = e.permit(b[0], now=0)
    assert refused.code is PermitCode.REJECT and "gang default/a is partly held" in (refused.reason or "")
    assert e.placement("default/b-0") is None  # its reservation went back


def test_a_third_party_permit_rule_can_reject_and_its_reason_names_it() -> None:
    class NoFridays:
        name = "NoFridays"

        def permit(self, engine: Any, pod: PodRequest, node: str) -> Verdict:
            return Verdict(PermitCode.REJECT, f"{pod.key} may not start on {node} today")

    e = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), permits=[NoFridays()])
    e.add_node(node_info(node_manifest("n0", allocatable={GPU: 8})))
    pod = pod_request(pod_manifest("p", {"main": {GPU: 1}}))[0]
    assert e.schedule(pod).scheduled
    answer = e.permit(pod, now=0)
    assert answer.code is PermitCode.REJECT and answer.reason == "NoFridays: default/p may not start on n0 today"
    assert not e.pod_keys()


class Answering:
    """An embedder's Permit rule that answers (or raises) what it is given."""

    def __init__(self, name: str, answer: Any) -> None:
        self.name, self.answer = name, answer

    def permit(self, engine: Any, pod: PodRequest, node: str) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (RuntimeError("database down"), "Flaky: the rule failed: RuntimeError: database down"),
        ("yes", "Flaky: the rule failed: WrongAnswer: returned 'yes' (str); a Verdict is due"),
        (None, "Flaky: the rule failed: WrongAnswer: returned None (NoneType); a Verdict is due"),
        (Verdict(PermitCode.WAIT, "later", timeout=float("nan")), "WAIT for nan (float); a number of seconds"),
        (Verdict(PermitCode.WAIT, "later", timeout=-5), "WAIT for -5 (int); a number of seconds"),
        (Verdict(PermitCode.WAIT, "later", timeout="10"), "WAIT for '10' (str); a number of seconds"),
        (Verdict(PermitCode.APPROVE, release="default/q"), "releasing 'default/q' (str); a tuple of pod keys"),
        (Verdict(PermitCode.REJECT, reason=42), "a reason 42 (int); a string or None"),
        (Verdict("approve"), "answered 'approve' (str); a PermitCode"),  # type: ignore[arg-type]
    ],
    ids=["raises", "a-string", "none", "nan-timeout", "negative-timeout", "text-timeout", "release-a-string",
         "reason-a-number", "code-a-string"],
)  # fmt: skip
def test_an_embedders_permit_rule_that_fails_costs_only_its_pod_with_a_reason_naming_it(
    answer: Any, reason: str
) -> None:
    plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    e = Engine(plugins, permits=[Answering("Flaky", answer)])
    e.add_node(node_info(node_manifest("n0", allocatable={GPU: 8})))
    pod = pod_request(pod_manifest("p", {"main": {GPU: 1}}))[0]
    assert e.schedule(pod).scheduled
    refused = e.permit(pod, now=0)
    assert refused.code is PermitCode.REJECT and reason in (refused.reason or ""), refused.reason
    assert not e.pod_keys() and not e.waiting_pods()  # its reservation went back, it waits nowhere
    assert plugins.hook_failures[("embedder", "rule Flaky (permit)")] == 1
    other = Engine(plugins, permits=[Answering("Fine", Verdict(PermitCode.APPROVE))])
    other.add_node(node_info(node_manifest("n0", allocatable={GPU: 8})))
    assert other.schedule(pod).scheduled and other.permit(pod, now=0).code is PermitCode.APPROVE


def test_an_ordinary_pod_is_approved_at_once() -> None:
    e = engine([1])
    pod = pod_request(pod_manifest("web", {"main": {GPU: 1}}))[0]
    assert e.schedule(pod).scheduled
    assert e.permit(pod, now=0).code is PermitCode.APPROVE


# -- gang-aware preemption ---------------------------------------------------------------------------------------


def test_a_high_priority_gang_evicts_the_low_priority_pods_of_one_rack_only() -> None:
    e = engine([4, 4])
    for r in range(2):
        for i in range(4):
            document = pod_manifest(f"low-{r}{i}", {"main": {GPU: 8}})
            document["spec"]["priority"] = 500 if r == 0 else 0
            assert e.reserve(pod_request(document)[0], f"r{r}-n{i}").scheduled
    urgent = gang("urgent", 4, priority=1000, annotations=required())
    assert not e.place_gang(urgent).placed
    preemption = e.preempt_gang(urgent)
    assert preemption.domain == "rack-1"  # the rack of the lowest priority
    assert sorted(preemption.victims) == [f"default/low-1{i}" for i in range(4)]
    assert len(e.pod_keys()) == 8  # a what-if
    for key in preemption.victims:
        e.release(key)
    assert e.place_gang(urgent).placed


def test_gang_preemption_prefers_the_rack_whose_victims_break_no_budget() -> None:
    e = engine([2, 2])
    for r in range(2):
        for i in range(2):
            document = pod_manifest(f"low-{r}{i}", {"main": {GPU: 8}})
            document["metadata"]["labels"] = {"app": f"app-{r}"}
            assert e.reserve(pod_request(document)[0], f"r{r}-n{i}").scheduled
    guarded = Budget("default", "pdb", LabelSelector((Requirement("app", "In", ("app-0",)),)), allowed=0)
    preemption = e.preempt_gang(gang("hi", 2, priority=10, annotations=required()), budgets=[guarded])
    assert preemption.domain == "rack-1" and preemption.violations == 0


def test_a_victim_gang_goes_whole_or_not_at_all() -> None:
    e = engine([2, 2])
    victims = gang("old", 4, priority=1)  # spans both racks
    assert e.place_gang(victims).placed
    preemption = e.preempt_gang(gang("new", 2, priority=100, annotations=required()))
    assert preemption.domain is not None
    assert sorted(preemption.victims) == sorted(p.key for p in victims)  # not just the two in one rack


def test_no_eviction_that_still_leaves_the_gang_unplaceable() -> None:
    e = engine([2, 2])
    for r in range(2):
        for i in range(2):
            assert e.reserve(pod_request(pod_manifest(f"low-{r}{i}", {"main": {GPU: 8}}))[0], f"r{r}-n{i}").scheduled
    preemption = e.preempt_gang(gang("wide", 3, priority=100, annotations=required()))
    assert preemption.domain is None and preemption.victims == ()
    assert "no domain would fit it" in (preemption.reason or "")


# -- members that join a placed gang, minResources, mixed member shapes, a domain held for a preempting gang ------


def test_a_member_arriving_after_its_gang_is_placed_joins_its_rack_not_the_tightest_node_elsewhere() -> None:
    e = engine([4, 1])
    placed = e.place_gang(gang("g", 2))
    assert placed.placed and placed.domain == "rack-0"
    late = e.place_gang([member("g", 2, total=2)])
    assert late.placed and racks_of(e, ["default/g-2"]) == Counter({"r0": 1}), "beside the gang, not in rack-1"


def test_a_member_joining_a_gang_that_requires_a_rack_waits_when_that_rack_is_full_and_says_where() -> None:
    e = engine([2, 4])
    group = pod_group(podgroup_document(minMember=2))
    e.set_pod_group(group)
    members = []
    for i in range(3):
        document = pod_manifest(f"train-7-{i}", {"main": {GPU: 8}}, namespace="ml")
        document["metadata"]["labels"] = {POD_GROUP_LABEL: "train-7"}
        members.append(pod_request(document)[0])
    assert e.place_gang(members[:2], group).domain == "rack-0"
    late = e.place_gang(members[2:], group, partial=True)
    assert not late.placed and e.placement("ml/train-7-2") is None, "never outside the gang's rack"
    assert late.reason == (
        "gang ml/train-7: 1 members need 8 nvidia.com/gpu each beside the members that hold places in rack rack-0; "
        "it has room for 0 of them"
    )


def test_a_podgroup_whose_min_resources_are_not_free_is_refused_as_coscheduling_refuses_it() -> None:
    e = engine([2])  # 16 GPUs in all
    group = pod_group(podgroup_document(minMember=2, minResources={GPU: 24, "cpu": "500"}))
    refused = e.place_gang(gang("train-7", 2, gpus=1, coscheduling=True), group)  # 2 GPUs: enough for them
    assert not refused.placed and not e.pod_keys()
    assert refused.reason == (
        "gang ml/train-7: PodGroup.spec.minResources is not free in the cluster: 500 cpu (free: 192), "
        "24 nvidia.com/gpu (free: 16)"
    )
    enough = pod_group(podgroup_document(minMember=2, minResources={GPU: 16}))
    assert e.place_gang(gang("train-7", 2, gpus=8, coscheduling=True), enough).placed


def test_a_launcher_beside_its_workers_is_counted_as_a_launcher_not_as_one_more_worker() -> None:
    e = engine([4, 6])
    document = pod_manifest("job-launcher", {"main": {"cpu": "2"}}, annotations={KUEUE_TOTAL: "5", **required()})
    document["metadata"]["labels"] = {KUEUE_GROUP_LABEL: "job"}
    launcher = pod_request(document)[0]
    workers = [member("job", i, total=5, annotations=required()) for i in range(1, 5)]
    placed = e.place_gang([launcher, *workers])
    assert placed.placed and placed.domain == "rack-0", "4 workers fit rack-0 exactly; rack-1 stays whole"
    assert set(racks_of(e, [launcher.key, *(w.key for w in workers)])) == {"r0"}


def test_a_domain_freed_for_a_preempting_gang_is_held_for_it_against_pods_of_lower_priority() -> None:
    e = engine([2, 2])
    for r in range(2):
        for i in range(2):
            assert e.reserve(pod_request(pod_manifest(f"low-{r}{i}", {"main": {GPU: 8}}))[0], f"r{r}-n{i}").scheduled
    urgent = gang("urgent", 2, priority=100, annotations=required())
    preemption = e.preempt_gang(urgent)
    e.nominate_gang("default/urgent", 100, preemption.level, preemption.domain)
    e.release(preemption.victims[0])  # the first victim is gone, the second still leaving
    ordinary = pod_request(pod_manifest("web", {"main": {GPU: 8}}))[0]
    refused = e.schedule(ordinary)
    assert not refused.scheduled and "nominated for a pending pod" in (refused.reason or "")
    e.release(preemption.victims[1])
    placed = e.place_gang(urgent)
    assert placed.placed and placed.domain == preemption.domain
    assert e.schedule(ordinary).scheduled is False, "the other rack is still full"
    assert not e.nominated_gangs, "placing the gang ends the hold"


def test_a_gang_of_no_topology_level_holds_only_the_nodes_its_victims_leave() -> None:
    e = engine([4], levels=())
    for i in range(2):
        assert e.reserve(pod_request(pod_manifest(f"low-{i}", {"main": {GPU: 8}}))[0], f"r0-n{i}").scheduled
    for i in range(2, 4):
        assert e.reserve(pod_request(pod_manifest(f"mid-{i}", {"main": {GPU: 4}}))[0], f"r0-n{i}").scheduled
    urgent = gang("urgent", 2, priority=100)
    preemption = e.preempt_gang(urgent)
    assert preemption.level is None and len(preemption.victims) == 2
    e.nominate_gang("default/urgent", 100, preemption.level, preemption.domain, preemption.victims)
    held = {e.placement(key).node for key in preemption.victims}  # type: ignore[union-attr]
    assert set(e.nominated_gangs["default/urgent"]) == held, "not the whole cluster"


# -- properties --------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    racks=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    gangs=st.lists(
        st.tuples(st.integers(1, 10), st.sampled_from([1, 2, 4, 8]), st.booleans(), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_never_a_partial_gang_and_never_a_device_held_twice(
    racks: list[int], gangs: list[tuple[int, int, bool, bool]]
) -> None:
    e = engine(racks)
    nodes = set(e.node_names())
    for number, (size, gpus, strict, drop) in enumerate(gangs):
        members = gang(f"g{number}", size, gpus=gpus, annotations=required() if strict else {})
        placed = e.place_gang(members)
        held = [key for key in e.pod_keys() if key.startswith(f"default/g{number}-")]
        assert len(held) == (size if placed.placed else 0)
        if placed.placed and strict:
            assert len({e.placement(key).node.split("-")[0] for key in held}) == 1  # type: ignore[union-attr]
        if placed.placed and drop:
            for key in held[: size // 2]:
                e.release(key)
        devices: Counter[tuple[str, str]] = Counter()
        for placement in e.placements():
            assert placement.node in nodes and placement.allocation is not None
            for resources in placement.allocation.containers.values():
                for device in resources.get(GPU, []):
                    devices[(placement.node, device)] += 1
        assert not [d for d, n in devices.items() if n > 1]


@given(
    rooms=st.lists(st.integers(0, 4), min_size=1, max_size=24),
    need=st.integers(1, 30),
    width=st.integers(1, 5),
)
def test_a_fit_holds_exactly_what_is_needed_within_each_nodes_room(rooms: list[int], need: int, width: int) -> None:
    names = [f"n{i}" for i in range(len(rooms))]
    labels = {name: {RACK: f"rack-{i // width}"} for i, name in enumerate(names)}
    room = dict(zip(names, rooms, strict=True))
    fit = gangfit.choose(room, labels, (RACK,), need, required=RACK)
    best = max(sum(r for n, r in room.items() if labels[n][RACK] == f"rack-{k}") for k in range(len(rooms)))
    if isinstance(fit, gangfit.Shortfall):
        assert best < need and fit.room == best
        return
    assert sum(count for _, count in fit.slots) == need
    assert all(0 < count <= room[node] for node, count in fit.slots)
    assert len({labels[node][RACK] for node, _ in fit.slots}) == 1
    chosen = sum(r for n, r in room.items() if labels[n][RACK] == fit.domain)
    assert chosen == min(
        total
        for k in range(len(rooms))
        if (total := sum(r for n, r in room.items() if labels[n][RACK] == f"rack-{k}")) >= need
    )


def test_a_gang_whose_member_a_plugin_refuses_before_any_node_is_refused_in_the_plugins_words() -> None:
    """The plugins' PreFilter (`kubegpu_scheduler_validate`) refuses a request no node can take; a plugin's fit need
    not repeat it (a cycle runs it first). A gang's members were placed without it: the toy plugin's refused
    members were reserved and signed their cards."""
    from . import toy_plugin as toy

    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False))
    engine.add_node(node_info(node_manifest("n", labels={"toy.example/cards": "2"}, allocatable={toy.RESOURCE: 2})))
    members = [
        pod_request(pod_manifest(f"m{i}", {"main": {toy.RESOURCE: 1}}, annotations={"toy.example/refuse": "y"}))[0]
        for i in range(2)
    ]
    placement = engine.place_gang(members)
    assert not placement.placed
    assert placement.reason == "default/m0: toy requests marked refuse are refused"
    assert not engine.pods


def test_choosing_where_a_gang_goes_sorts_the_names_on_its_path_not_every_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 200 gangs that fit in no rack of 1,000 nodes are each tried again whenever the cluster changes: the sort key
    # of every node's name, made on each try, was most of a try's time (55,650 keys for 50 tries; 3,150 now).
    made = Counter[str]()
    real = gangfit.natural

    def counted(name: str) -> tuple[object, ...]:
        made[name] += 1
        return real(name)

    monkeypatch.setattr(gangfit, "natural", counted)
    rooms = {f"r{i // 20}-n{i}": 1 for i in range(1000)}
    labels = {name: {RACK: name.split("-")[0]} for name in rooms}
    short = gangfit.choose(rooms, labels, (RACK,), 21, required=RACK)
    assert isinstance(short, gangfit.Shortfall) and short.room == 20
    fit = gangfit.choose(rooms, labels, (RACK,), 20, required=RACK)
    assert isinstance(fit, gangfit.Fit) and fit.domain == "r0" and len(fit.slots) == 20
    assert sum(made.values()) <= 200, f"{sum(made.values())} sort keys for two choices over 1,000 nodes in 50 racks"


def test_no_eviction_for_a_gang_whose_driver_would_find_no_room_beside_its_workers() -> None:
    # Two 8-GPU workers and a 1-GPU driver need 17 GPUs in one rack of 16: no eviction lets the gang in. The room
    # was counted for the workers alone, so a rack's pods were evicted for a gang that still could not go.
    e = engine([2, 2])
    for r in range(2):
        for i in range(2):
            assert e.reserve(pod_request(pod_manifest(f"low-{r}{i}", {"main": {GPU: 8}}))[0], f"r{r}-n{i}").scheduled
    job = [member("job", i, gpus=8 if i < 2 else 1, total=3, priority=100, annotations=required()) for i in range(3)]
    assert not e.place_gang(job).placed
    preemption = e.preempt_gang(job)
    assert preemption.victims == () and "no domain would fit it" in (preemption.reason or "")
    # With a third node in rack-1, evicting its three pods lets the whole gang in, driver included.
    e.add_node(node_info(node_manifest("r1-n2", labels={RACK: "rack-1"}, allocatable={GPU: 8})))
    assert e.reserve(pod_request(pod_manifest("low-12", {"main": {GPU: 8}}))[0], "r1-n2").scheduled
    preemption = e.preempt_gang(job)
    assert preemption.domain == "rack-1" and len(preemption.victims) == 3, preemption
    for key in preemption.victims:
        e.release(key)
    assert e.place_gang(job).placed


def test_a_gang_preemption_weighing_a_waiting_members_node_leaves_it_waiting_with_its_timeout() -> None:
    # A gang of priority 100 weighs evicting the pods of a rack where a member of a gang of priority 0 waits at
    # Permit: the what-if made that member wait no more (it kept its place, but its timeout no longer counted).
    e = engine([2, 2])
    waiting = member("slow", 0, total=2, annotations=required())
    assert e.reserve(waiting, "r0-n0").scheduled
    assert e.permit(waiting, now=0.0).code is PermitCode.WAIT
    for name in ("r0-n1", "r1-n0", "r1-n1"):
        assert e.reserve(pod_request(pod_manifest(f"low-{name}", {"main": {GPU: 8}}))[0], name).scheduled
    job = [member("job", i, total=2, priority=100, annotations=required()) for i in range(2)]
    assert e.preempt_gang(job).victims
    assert e.is_waiting(waiting.key) and e.placement(waiting.key) is not None
    assert [w.pod.key for w in e.expire(3600.0)] == [waiting.key]


def test_a_pod_preempting_a_running_gang_takes_the_whole_gang_or_prefers_a_node_that_breaks_none() -> None:
    # A training gang of priority 0 (minMember 2) runs on r0's two nodes; a lone pod of priority 0 on r1-n0; r1-n1
    # runs a pod of priority 1000. A pod of priority 500 needs a whole node.
    e = engine([2, 2])
    job = gang("train", 2)
    assert e.place_gang(job).placed
    lone = pod_request(pod_manifest("lone", {"main": {GPU: 8}}))[0]
    assert e.reserve(lone, "r1-n0").scheduled
    high = pod_request(pod_manifest("high", {"main": {GPU: 8}}))[0]
    keeper = pod_request(pod_manifest("keeper", {"main": {GPU: 8}}))[0]
    assert e.reserve(replace(keeper, priority=1000), "r1-n1").scheduled
    urgent = replace(high, priority=500)
    for _ in range(3):  # whichever node the dry run starts from: the lone pod goes, not one worker of the gang
        preemption = e.preempt(urgent)
        assert preemption.victims == (lone.key,), preemption
    # Without the lone pod's node, one worker evicted would leave the other running uselessly, below minMember:
    # the whole gang goes, and its job is restarted whole by its owner.
    e.release(lone.key)
    assert e.reserve(replace(keeper, name="keeper-2", uid="uid-keeper-2", priority=1000), "r1-n0").scheduled
    preemption = e.preempt(urgent)
    assert sorted(preemption.victims) == sorted(m.key for m in job), preemption
    # A gang with a member of the preemptor's priority or higher cannot go whole: its nodes are no candidates.
    e.release(job[1].key)
    assert e.reserve(replace(job[1], priority=1000), "r0-n1").scheduled
    assert e.preempt(urgent).node is None


def test_a_bound_pod_that_cannot_take_a_waiting_members_devices_leaves_it_waiting_with_its_timeout() -> None:
    # A gang member waits at Permit on GPUs 0-3. A pod reported bound there names them too, in an allocation issued
    # later (another replica's, on a node whose GPUs it saw as 12), so the member is displaced while the bound pod's
    # devices are tried; they still do not fit (GPUs 8-11 are not there) and the member is put back. Its wait had
    # ended: the member held its place waiting for nothing, never timed out, and was queued again while holding it.
    key = b"k" * 32
    e = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=key)
    e.add_node(node_info(node_manifest("n0", allocatable={GPU: 8})))
    waiting = member("slow", 0, total=2, gpus=4)
    assert e.reserve(waiting, "n0").scheduled
    assert e.permit(waiting, now=0.0).code is PermitCode.WAIT
    other = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=key)
    other.add_node(node_info(node_manifest("n0", allocatable={GPU: 12})))
    bound = pod_request(pod_manifest("bound", {"main": {GPU: 12}}))[0]
    decision = other.reserve(bound, "n0")
    assert decision.scheduled and decision.allocation is not None
    status = e.admit_bound(bound, "n0", decision.allocation)
    assert not status.ok
    assert e.placement(waiting.key) is not None and e.is_waiting(waiting.key), "the member still waits, as it was"
    assert [w.pod.key for w in e.expire(3600.0)] == [waiting.key]
    # Where the bound pod's devices do fit, the member is displaced: it holds nothing and waits no more.
    assert e.reserve(waiting, "n0").scheduled and e.permit(waiting, now=3600.0).code is PermitCode.WAIT
    fitting = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=key)
    fitting.add_node(node_info(node_manifest("n0", allocatable={GPU: 8})))
    later = pod_request(pod_manifest("later", {"main": {GPU: 8}}))[0]
    decision = fitting.reserve(later, "n0")
    assert decision.allocation is not None and e.admit_bound(later, "n0", decision.allocation).ok
    assert e.placement(waiting.key) is None and not e.is_waiting(waiting.key)


def test_the_budgets_of_the_gang_members_a_preemption_takes_with_its_victims_count() -> None:
    # A training gang (minMember 2) runs on r0, guarded by a PodDisruptionBudget that allows one disruption; r1-n0
    # runs a pod of priority 100 no budget guards, r1-n1 one of priority 1000. A pod of priority 500 needs a node.
    # Evicting one worker breaks no budget, but its gang goes whole, and the second worker does break it: counted
    # as none, the gang's node won (its victims' priority is lower) and the budget was broken.
    e = engine([2, 2])
    job = gang("train", 2)
    assert e.place_gang(job).placed
    assert racks_of(e, [m.key for m in job]) == Counter({"r0": 2})
    lone = pod_request(pod_manifest("lone", {"main": {GPU: 8}}))[0]
    assert e.reserve(replace(lone, priority=100), "r1-n0").scheduled
    keeper = pod_request(pod_manifest("keeper", {"main": {GPU: 8}}))[0]
    assert e.reserve(replace(keeper, priority=1000), "r1-n1").scheduled
    urgent = replace(pod_request(pod_manifest("urgent", {"main": {GPU: 8}}))[0], priority=500)
    assert sorted(e.preempt(urgent).victims) == sorted(m.key for m in job), "without a budget, the gang goes"
    budget = Budget("default", "train", LabelSelector((Requirement(KUEUE_GROUP_LABEL, "In", ("train",)),)), allowed=1)
    for _ in range(3):  # whichever node the dry run starts from
        preemption = e.preempt(urgent, budgets=[budget])
        assert preemption.victims == (lone.key,) and preemption.violations == 0, preemption

    # A gang's preemption likewise: the victim gang spans r0 and r1, so taking one rack takes the other rack's
    # members too, and its budget (two disruptions) is broken by them, not by the rack's own.
    e = engine([2, 2, 2])
    old = gang("old", 4, priority=1)
    assert e.place_gang(old).placed
    assert racks_of(e, [m.key for m in old]) == Counter({"r0": 2, "r1": 2})
    for i in range(2):
        assert e.reserve(replace(lone, name=f"lone-{i}", uid=f"uid-lone-{i}", priority=50), f"r2-n{i}").scheduled
    new = gang("new", 2, priority=100, annotations=required())
    assert e.preempt_gang(new).domain in ("rack-0", "rack-1"), "without a budget, the gang of lowest priority goes"
    budget = Budget("default", "old", LabelSelector((Requirement(KUEUE_GROUP_LABEL, "In", ("old",)),)), allowed=2)
    preemption = e.preempt_gang(new, budgets=[budget])
    assert preemption.domain == "rack-2" and preemption.violations == 0, preemption
