"""Gangs placed by `kubegpu scheduler` on a real kube-apiserver: a training job's pods, each naming its gang and the
gang's size and asking for its rack, are bound whole in one rack or not at all, and each member is told why it waits.

No kubelet runs here: pods stay Pending once bound, and run with `terminationGracePeriodSeconds: 0` so that a
preemption's deletions take effect at once. Racks are the nodes' `topology.kubernetes.io/rack` label, a level of the
Kueue Topology the scheduler is given (`--topology gang-topology.yaml`). The members are Kueue pod-group members;
test_podgroups.py tells the same stories with PodGroup objects.
"""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import orjson
import urllib3

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation

from .cluster import Cluster, wait_for
from .gangs import (
    TOPOLOGY,
    BindRecorder,
    create_member,
    create_pod,
    create_racks,
    events_of,
    install_podgroup_crd,
    placements,
)
from .test_preemption import priority_classes

SCHEDULER = "kubegpu-gangs"


def start(start_scheduler: Any, *extra: str) -> Any:
    return start_scheduler(SCHEDULER, "--no-leader-elect", "--topology", str(TOPOLOGY), *extra)


def racks_of(where: dict[str, str], nodes: dict[str, str | None]) -> set[str]:
    return {where[node] for node in nodes.values() if node}


def all_bound(cluster: Cluster, namespace: str, names: list[str]) -> dict[str, str | None] | None:
    found = placements(cluster, namespace, names)
    return found if all(found.values()) else None


def told(cluster: Cluster, namespace: str, reason: str, text: str = "") -> set[str]:
    """The pods that got an Event with this reason (and this text in its message)."""
    return {e["involvedObject"]["name"] for e in events_of(cluster, namespace, reason) if text in e["message"]}


def assert_no_device_held_twice(cluster: Cluster, namespace: str) -> None:
    held: Counter[tuple[str, str]] = Counter()
    for pod in cluster.pods(namespace):
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_KEY)
        if pod["spec"].get("nodeName") and raw:
            record = decode_allocation(raw)
            for resources in record.containers.values():
                held.update((record.node, device) for ids in resources.values() for device in ids)
    assert all(count == 1 for count in held.values()), [k for k, n in held.items() if n > 1]


def test_a_32_member_gang_binds_whole_in_one_rack_once_its_last_member_exists(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    # 2 GPUs a member, 64 in all: rack-b (8 nodes) fits it exactly, rack-a is too small, rack-c would be broken up.
    where = create_racks(cluster, {"rack-a": 6, "rack-b": 8, "rack-c": 10})
    scheduler = start(start_scheduler)
    members = [f"train-{i}" for i in range(32)]
    with BindRecorder(cluster, namespace) as recorder:
        for i, name in enumerate(members[:31]):
            create_member(cluster, namespace, name, "train", 2, total=32, scheduler=SCHEDULER, index=i)
        wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 31, 60, "31 members told they wait")
        assert not recorder.bound, f"bound before the gang had 32 members: {sorted(recorder.bound)}"
        message = events_of(cluster, namespace, "WaitingForGang")[-1]["message"]
        assert "of minMember 32" in message, message

        create_member(cluster, namespace, members[31], "train", 2, total=32, scheduler=SCHEDULER, index=31)
        nodes = wait_for(lambda: all_bound(cluster, namespace, members), 60, "all 32 members bound")
    assert racks_of(where, nodes) == {"rack-b"}, nodes
    assert Counter(nodes.values()) == Counter({node: 4 for node, rack in where.items() if rack == "rack-b"})
    by_rank = [nodes[f"train-{i}"] for i in range(32)]
    assert by_rank == sorted(by_rank, key=lambda n: int(n.rsplit("n", 1)[1])), "neighbouring ranks share nodes"
    assert_no_device_held_twice(cluster, namespace)
    answer = urllib3.request("GET", f"http://127.0.0.1:{scheduler.metrics_port}/readyz", timeout=2.0)
    assert orjson.loads(answer.data)["apis"]["podgroups"] == "scheduling.x-k8s.io/v1alpha1"


def test_two_gangs_competing_for_one_rack_one_binds_whole_and_the_other_holds_nothing(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    create_racks(cluster, {"rack-x": 4})
    start(start_scheduler)
    blue, green = [f"blue-{i}" for i in range(4)], [f"green-{i}" for i in range(4)]
    with BindRecorder(cluster, namespace) as recorder:
        for i in range(4):  # interleaved, as two jobs submitted together arrive
            create_member(cluster, namespace, blue[i], "blue", 8, total=4, scheduler=SCHEDULER, index=i)
            create_member(cluster, namespace, green[i], "green", 8, total=4, scheduler=SCHEDULER, index=i)
        wait_for(lambda: len(recorder.bound) >= 4, 60, "one gang bound")

        def losers_told() -> set[str]:
            losers = set(green) if set(blue) <= set(recorder.bound) else set(blue)
            return losers if told(cluster, namespace, "FailedScheduling", "gang") >= losers else set()

        losers = wait_for(losers_told, 60, "every member of the other gang told why it waits")
        winners = set(blue + green) - losers
        assert set(recorder.bound) == winners, f"partly bound: {sorted(recorder.bound)}"

        for name in sorted(winners):  # the first job finishes: the second binds whole in its place
            cluster.delete_pod(namespace, name)
        wait_for(lambda: set(recorder.bound) >= losers, 60, "the waiting gang bound once the rack was free")
    assert_no_device_held_twice(cluster, namespace)


def test_a_gang_below_its_min_member_binds_nothing_and_gives_its_places_back_at_its_timeout(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    create_racks(cluster, {"rack-t": 2})
    start(start_scheduler)
    with BindRecorder(cluster, namespace) as recorder:
        for i in range(3):  # the fourth member never comes
            create_member(cluster, namespace, f"slow-{i}", "slow", 4, total=4, scheduler=SCHEDULER, index=i)
        wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 3, 30, "3 members told they wait")
        # While the three hold their places, a whole-node pod fits nowhere (12 of 16 GPUs held, 4 on either node).
        create_pod(cluster, namespace, "solo", 8, scheduler=SCHEDULER)
        wait_for(lambda: "solo" in told(cluster, namespace, "FailedScheduling"), 30, "the whole-node pod refused")
        # Kueue's pod groups wait 60 s (scheduler-plugins' default; a PodGroup sets its own).
        wait_for(lambda: len(told(cluster, namespace, "FailedScheduling", "timed out")) == 3, 90, "the timeout")
        message = next(e for e in events_of(cluster, namespace, "FailedScheduling") if "timed out" in e["message"])
        assert "3 of minMember 4" in message["message"], message["message"]
        wait_for(lambda: placements(cluster, namespace, ["solo"])["solo"], 30, "the whole-node pod bound after it")
        # The recorder's watch may lag the read that saw the bind: wait until it has seen it too, then it has seen
        # every bind before it (a watch delivers in order).
        wait_for(lambda: "solo" in recorder.bound, 30, "the recorder to see the whole-node pod bound")
        assert set(recorder.bound) == {"solo"}, sorted(recorder.bound)


def test_a_malformed_gang_costs_only_its_own_members(cluster: Cluster, namespace: str, start_scheduler: Any) -> None:
    create_racks(cluster, {"rack-m": 1})
    scheduler = start(start_scheduler)
    create_member(cluster, namespace, "broken-0", "broken", 1, total="four", scheduler=SCHEDULER)
    create_pod(cluster, namespace, "plain", 1, scheduler=SCHEDULER)
    wait_for(lambda: placements(cluster, namespace, ["plain"])["plain"], 30, "the ordinary pod bound")
    event = wait_for(
        lambda: [
            e for e in events_of(cluster, namespace, "FailedScheduling") if "pod-group-total-count" in e["message"]
        ],
        30,
        "the member told which annotation is wrong",
    )[0]
    assert event["involvedObject"]["name"] == "broken-0" and "'four' is not a whole number" in event["message"]
    assert placements(cluster, namespace, ["broken-0"])["broken-0"] is None
    assert scheduler.process.poll() is None


def test_a_high_priority_gang_evicts_the_low_priority_pods_of_one_rack(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    priority_classes(cluster)
    where = create_racks(cluster, {"rack-p": 2, "rack-q": 2})
    start(start_scheduler)
    fillers = [f"filler-{i}" for i in range(4)]
    for name in fillers:
        create_pod(cluster, namespace, name, 8, scheduler=SCHEDULER, priority="kubegpu-test-low")
    wait_for(lambda: all_bound(cluster, namespace, fillers), 30, "the fillers bound")
    urgent = ["urgent-0", "urgent-1"]
    for i, name in enumerate(urgent):
        create_member(cluster, namespace, name, "urgent", 8, total=2, scheduler=SCHEDULER, index=i,
                      priority="kubegpu-test-top")  # fmt: skip
    nodes = wait_for(lambda: all_bound(cluster, namespace, urgent), 60, "the gang bound")
    (rack,) = racks_of(where, nodes)
    left = {name: node for name, node in placements(cluster, namespace, fillers).items() if node}
    assert len(left) == 2 and racks_of(where, left) == {"rack-p", "rack-q"} - {rack}, left
    preempted = told(cluster, namespace, "Preempted", "gang")
    assert len(preempted) == 2 and preempted.isdisjoint(left)
    assert_no_device_held_twice(cluster, namespace)


def test_a_scheduler_killed_while_binding_a_gang_finishes_it_after_a_restart(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    where = create_racks(cluster, {"rack-k": 4, "rack-l": 5})
    # Two writes a second: the gang's 16 Bindings take about 8 s, and the kill lands among them.
    first = start(start_scheduler, "--kube-api-qps", "2", "--kube-api-burst", "1")
    members = [f"resume-{i}" for i in range(16)]
    for i, name in enumerate(members):
        create_member(cluster, namespace, name, "resume", 2, total=16, scheduler=SCHEDULER, index=i)
    wait_for(lambda: sum(bool(n) for n in placements(cluster, namespace, members).values()) >= 2, 60, "bindings")
    first.kill(signal.SIGKILL)
    before = {name: node for name, node in placements(cluster, namespace, members).items() if node}
    assert 2 <= len(before) < 16, before
    start(start_scheduler)
    nodes = wait_for(lambda: all_bound(cluster, namespace, members), 60, "the whole gang bound after the restart")
    assert {name: nodes[name] for name in before} == before, "members bound before the kill stay where they are"
    assert len(racks_of(where, nodes)) == 1, nodes
    assert_no_device_held_twice(cluster, namespace)


def test_members_waiting_at_permit_preempted_by_a_pod_are_let_go_whole_not_deleted_and_come_back_whole(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    # Gang blue (3 whole-node members, one rack) has two members waiting at Permit on two of rack-w's three nodes;
    # then the third takes a pod of top priority. A pod of high priority needs a whole node: blue's waiting members are
    # the only pods it may preempt. Deleted, they were lost to their job (no controller recreates them here).
    priority_classes(cluster)
    create_racks(cluster, {"rack-w": 3})
    start(start_scheduler)
    blue = [create_member(cluster, namespace, f"blue-{i}", "blue", 8, total=3, scheduler=SCHEDULER, index=i)
            for i in range(2)]  # fmt: skip
    uids = {m["metadata"]["name"]: m["metadata"]["uid"] for m in blue}
    wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 2, 30, "2 members told they wait")
    create_pod(cluster, namespace, "keeper", 8, scheduler=SCHEDULER, priority="kubegpu-test-top")
    wait_for(lambda: placements(cluster, namespace, ["keeper"])["keeper"], 30, "the keeper bound on the third node")
    with BindRecorder(cluster, namespace) as recorder:
        create_pod(cluster, namespace, "high", 8, scheduler=SCHEDULER, priority="kubegpu-test-high")
        wait_for(lambda: placements(cluster, namespace, ["high"])["high"], 30, "the high pod bound")
        let_go = wait_for(
            lambda: told(cluster, namespace, "FailedScheduling", "while waiting at Permit") >= set(uids) or None,
            30,
            "both members told they were let go",
        )
        assert let_go
        alive = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods(namespace)}
        assert {name: alive.get(name) for name in uids} == uids, "let go, not deleted: the same pods still exist"
        assert not told(cluster, namespace, "Preempted") & set(uids)
        message = next(
            e["message"]
            for e in events_of(cluster, namespace, "FailedScheduling")
            if e["involvedObject"]["name"] == "blue-1" and "while waiting at Permit" in e["message"]
        )
        assert message.startswith("preempted by pod ") and "gang " in message and "gave back" in message, message

        # The high pod and the keeper finish: blue's two are placed again, waiting together, and the third
        # completes it, bound whole in the rack.
        cluster.delete_pod(namespace, "high")
        cluster.delete_pod(namespace, "keeper")
        create_member(cluster, namespace, "blue-2", "blue", 8, total=3, scheduler=SCHEDULER, index=2)
        members = ["blue-0", "blue-1", "blue-2"]
        nodes = wait_for(lambda: all_bound(cluster, namespace, members), 60, "the gang bound whole")
        assert len(set(nodes.values())) == 3, nodes
        assert set(recorder.bound) == {"keeper", "high", *members}, sorted(recorder.bound)
    assert_no_device_held_twice(cluster, namespace)


def test_a_high_priority_pod_preempts_a_running_gang_whole_not_one_member(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    # Gang train (2 whole-node members) runs on rack-g; rack-h's only node runs a pod of top priority. A pod of high
    # priority needs a whole node: one worker evicted left the other running below minMember, holding its node for
    # a job that could not go on.
    priority_classes(cluster)
    where = create_racks(cluster, {"rack-g": 2, "rack-h": 1})
    start(start_scheduler)
    keeper_node = next(node for node, rack in where.items() if rack == "rack-h")
    train = ["train-0", "train-1"]
    for i, name in enumerate(train):
        create_member(cluster, namespace, name, "train", 8, total=2, scheduler=SCHEDULER, index=i,
                      priority="kubegpu-test-low")  # fmt: skip
    nodes = wait_for(lambda: all_bound(cluster, namespace, train), 30, "the gang bound")
    assert racks_of(where, nodes) == {"rack-g"}, nodes
    create_pod(cluster, namespace, "keeper", 8, scheduler=SCHEDULER, priority="kubegpu-test-top")
    assert wait_for(lambda: placements(cluster, namespace, ["keeper"])["keeper"], 30, "the keeper bound") == keeper_node
    create_pod(cluster, namespace, "high", 8, scheduler=SCHEDULER, priority="kubegpu-test-high")
    node = wait_for(lambda: placements(cluster, namespace, ["high"])["high"], 60, "the high pod bound")
    assert where[node] == "rack-g"
    wait_for(lambda: not set(train) & set(placements(cluster, namespace)), 30, "the whole gang gone")
    assert told(cluster, namespace, "Preempted") >= set(train), "each member told it was preempted"
    assert placements(cluster, namespace)["keeper"] == keeper_node
    assert_no_device_held_twice(cluster, namespace)
