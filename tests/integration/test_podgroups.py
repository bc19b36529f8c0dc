"""Gangs described by scheduler-plugins' PodGroup objects on a real kube-apiserver, as the owner of a training job
sees them: the PodGroup written with `kubectl apply`, its members labelled with its name, and what
`kubectl get podgroup` and `kubectl describe podgroup` show while `kubegpu scheduler` places the job.

The CRD is the deploy manifests' (examples/deploy/kustomize/base/podgroup-crd.yaml). No kubelet runs: pods stay
Pending once bound. Racks are the nodes' `topology.kubernetes.io/rack` label, a level of the scheduler's
`--topology`; the PodGroups require one rack with Kueue's annotation.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kubegpu.kube.client import ApiError

from .cluster import Cluster, wait_for
from .gangs import (
    BindRecorder,
    create_member,
    create_pod,
    create_podgroup,
    create_racks,
    events_of,
    install_podgroup_crd,
    placements,
    podgroup_status,
)
from .test_gangs import all_bound, assert_no_device_held_twice, racks_of, start, told


def podgroup_events(cluster: Cluster, namespace: str, reason: str) -> list[str]:
    """The messages of the Events with this reason on PodGroups (what `kubectl describe podgroup` lists)."""
    return [e["message"] for e in events_of(cluster, namespace, reason, kind="PodGroup")]


def test_a_32_member_podgroup_binds_whole_in_one_rack_and_its_status_and_events_are_on_the_server(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    # 2 GPUs a member, 64 in all: rack-b (8 nodes) fits it exactly, rack-a is too small, rack-c would be broken up.
    where = create_racks(cluster, {"rack-a": 6, "rack-b": 8, "rack-c": 10})
    start(start_scheduler)
    create_podgroup(cluster, namespace, "train", {"minMember": 32, "scheduleTimeoutSeconds": 300})
    members = [f"train-{i}" for i in range(32)]
    with BindRecorder(cluster, namespace) as recorder:
        for i, name in enumerate(members[:31]):
            create_member(cluster, namespace, name, "train", 2, total=32, scheduler="kubegpu-gangs", index=i,
                          podgroup=True)  # fmt: skip
        wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 31, 60, "31 members told they wait")
        assert not recorder.bound, f"bound before the PodGroup had 32 members: {sorted(recorder.bound)}"
        assert "of minMember 32" in events_of(cluster, namespace, "WaitingForGang")[-1]["message"]
        pending = wait_for(lambda: podgroup_status(cluster, namespace, "train").get("phase") == "Pending" or None,
                           30, "the PodGroup Pending while 31 of 32 exist")  # fmt: skip
        assert pending

        create_member(cluster, namespace, members[31], "train", 2, total=32, scheduler="kubegpu-gangs", index=31,
                      podgroup=True)  # fmt: skip
        nodes = wait_for(lambda: all_bound(cluster, namespace, members), 60, "all 32 members bound")
    assert racks_of(where, nodes) == {"rack-b"}, nodes
    assert Counter(nodes.values()) == Counter({node: 4 for node, rack in where.items() if rack == "rack-b"})
    assert_no_device_held_twice(cluster, namespace)

    status = wait_for(
        lambda: (s := podgroup_status(cluster, namespace, "train")).get("phase") == "Scheduled" and s,
        30,
        "the PodGroup's status Scheduled",
    )
    assert status["scheduled"] == 32 and status["running"] == 0 and status["failed"] == 0, status
    assert status["scheduleStartTime"]
    scheduled = wait_for(lambda: podgroup_events(cluster, namespace, "Scheduled"), 30, "a Scheduled Event")
    assert scheduled == ["32 members bound (minMember 32)"]
    listed = cluster.client.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/train")
    assert listed["spec"] == {"minMember": 32, "scheduleTimeoutSeconds": 300}, "the scheduler never writes the spec"


def test_a_podgroup_short_of_members_binds_nothing_and_gives_its_places_back_at_its_timeout(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    create_racks(cluster, {"rack-t": 2})
    start(start_scheduler)
    create_podgroup(cluster, namespace, "slow", {"minMember": 4, "scheduleTimeoutSeconds": 5})
    with BindRecorder(cluster, namespace) as recorder:
        for i in range(3):  # the fourth member never comes
            create_member(cluster, namespace, f"slow-{i}", "slow", 4, total=4, scheduler="kubegpu-gangs", index=i,
                          podgroup=True)  # fmt: skip
        wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 3, 30, "3 members told they wait")
        assert "(up to 5s)" in events_of(cluster, namespace, "WaitingForGang")[0]["message"]
        timed_out = wait_for(
            lambda: [m for m in podgroup_events(cluster, namespace, "FailedScheduling") if "timed out" in m],
            30,
            "the PodGroup told its members gave their places back",
        )
        assert "timed out after 5s waiting at Permit: 3 of minMember 4 members held places" in timed_out[0]
        assert len(told(cluster, namespace, "FailedScheduling", "timed out")) == 3
        # Their places are free again: a whole-node pod binds on either node.
        create_pod(cluster, namespace, "solo", 8, scheduler="kubegpu-gangs")
        wait_for(lambda: placements(cluster, namespace, ["solo"])["solo"], 30, "the whole-node pod bound")
        # The recorder's watch may lag the read that saw the bind: wait until it has seen it too, then it has seen
        # every bind before it (a watch delivers in order).
        wait_for(lambda: "solo" in recorder.bound, 30, "the recorder to see the whole-node pod bound")
        assert set(recorder.bound) == {"solo"}, sorted(recorder.bound)
    status = podgroup_status(cluster, namespace, "slow")
    assert status.get("phase") == "Pending" and status.get("scheduled") == 0, status


def test_a_malformed_podgroup_is_refused_by_the_api_server_or_told_to_its_members(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    create_racks(cluster, {"rack-m": 1})
    scheduler = start(start_scheduler)
    # The CRD's schema types the fields: `kubectl apply` of a string minMember is refused, naming the field.
    with pytest.raises(ApiError) as refused:
        create_podgroup(cluster, namespace, "typo", {"minMember": "abc"})
    assert refused.value.status == 422 and "spec.minMember" in str(refused.value), refused.value
    with pytest.raises(ApiError):
        cluster.client.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/typo")

    # A field the schema does not name (a typo) is pruned without a word, as any structural schema prunes it: the
    # PodGroup stored has no minMember, which kubegpu reads as 1 (docs/gangs.md says so).
    pruned = create_podgroup(cluster, namespace, "pruned", {"minMembers": 4})
    assert pruned["spec"] == {}, pruned["spec"]

    # The schema checks types only: a minMember of 0 is stored, and kubegpu tells the members and the PodGroup.
    create_podgroup(cluster, namespace, "zero", {"minMember": 0})
    create_member(cluster, namespace, "zero-0", "zero", 1, total=1, scheduler="kubegpu-gangs", podgroup=True)
    create_pod(cluster, namespace, "plain", 1, scheduler="kubegpu-gangs")
    wait_for(lambda: placements(cluster, namespace, ["plain"])["plain"], 30, "the ordinary pod bound")
    message = "PodGroup {}/zero cannot be read: PodGroup.spec.minMember: 0 is out of range (1 to 10000)"
    wait_for(lambda: "zero-0" in told(cluster, namespace, "FailedScheduling", message.format(namespace)), 30,
             "the member told which field is wrong")  # fmt: skip
    on_group = wait_for(lambda: podgroup_events(cluster, namespace, "FailedScheduling"), 30, "the PodGroup told")
    assert on_group == [message.format(namespace)]
    assert placements(cluster, namespace, ["zero-0"])["zero-0"] is None
    assert scheduler.process.poll() is None

    # Fixed by its owner: the member binds without a restart.
    path = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/zero"
    cluster.client.patch(path, {"spec": {"minMember": 1}})
    wait_for(lambda: placements(cluster, namespace, ["zero-0"])["zero-0"], 30, "the member bound once fixed")


def test_a_typo_in_a_workers_podgroup_label_and_a_podgroup_deleted_while_its_members_wait_are_told_and_held_nothing(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    create_racks(cluster, {"rack-t": 2})
    start(start_scheduler)
    create_podgroup(cluster, namespace, "train", {"minMember": 3, "scheduleTimeoutSeconds": 3600})
    for i in range(2):
        create_member(cluster, namespace, f"train-{i}", "train", 4, total=3, scheduler="kubegpu-gangs", index=i,
                      podgroup=True)  # fmt: skip
    # The third worker's label has a typo: it runs alone, and it is told so.
    create_member(cluster, namespace, "train-2", "trian", 4, total=3, scheduler="kubegpu-gangs", index=2,
                  podgroup=True)  # fmt: skip
    wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 2, 30, "2 members told they wait")
    wait_for(lambda: placements(cluster, namespace, ["train-2"])["train-2"], 30, "the worker with the typo bound")
    (typo,) = wait_for(lambda: events_of(cluster, namespace, "PodGroupNotFound"), 30, "the typo's Event")
    assert typo["involvedObject"]["name"] == "train-2" and typo["type"] == "Warning"
    assert typo["message"].startswith(f"PodGroup {namespace}/trian does not exist: the pod is scheduled alone")

    # The job's owner deletes the PodGroup: the two waiting workers do not hold their places for the hour.
    cluster.client.delete(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/train")
    wait_for(lambda: all_bound(cluster, namespace, ["train-0", "train-1"]), 30, "the waiting workers bound alone")
    assert_no_device_held_twice(cluster, namespace)


def test_workers_whose_rack_is_deleted_while_they_wait_at_permit_bind_in_another_rack_when_the_last_one_comes(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    # Two racks alike: the two first workers hold places in rack-p (ties go to the rack named first).
    where = create_racks(cluster, {"rack-p": 3, "rack-q": 3})
    start(start_scheduler)
    create_podgroup(cluster, namespace, "train", {"minMember": 3, "scheduleTimeoutSeconds": 3600})
    for i in range(2):
        create_member(cluster, namespace, f"train-{i}", "train", 8, total=3, scheduler="kubegpu-gangs", index=i,
                      podgroup=True)  # fmt: skip
    wait_for(lambda: len(told(cluster, namespace, "WaitingForGang")) == 2, 30, "2 members told they wait")
    for node in [n for n, rack in where.items() if rack == "rack-p"]:
        cluster.client.delete(f"/api/v1/nodes/{node}")
    create_member(cluster, namespace, "train-2", "train", 8, total=3, scheduler="kubegpu-gangs", index=2,
                  podgroup=True)  # fmt: skip
    # Before, the two held their lost places at Permit for the hour, and the gang bound nothing meanwhile.
    bound = wait_for(lambda: all_bound(cluster, namespace, ["train-0", "train-1", "train-2"]), 30, "all 3 bound")
    assert racks_of(where, bound) == {"rack-q"}
    assert_no_device_held_twice(cluster, namespace)


def test_a_driver_placed_before_its_workers_where_they_find_no_room_binds_with_them_in_a_rack_that_holds_all(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    install_podgroup_crd(cluster)
    # A 1-GPU driver alone fits best in the 1-node rack-s; its two 8-GPU workers fit only in rack-t, with it.
    where = create_racks(cluster, {"rack-s": 1, "rack-t": 3})
    start(start_scheduler)
    create_podgroup(cluster, namespace, "job", {"minMember": 3, "scheduleTimeoutSeconds": 3600})
    create_member(cluster, namespace, "job-driver", "job", 1, total=3, scheduler="kubegpu-gangs", podgroup=True)
    wait_for(lambda: told(cluster, namespace, "WaitingForGang") == {"job-driver"}, 30, "the driver told it waits")
    for i in range(2):
        create_member(cluster, namespace, f"job-worker-{i}", "job", 8, total=3, scheduler="kubegpu-gangs", index=i,
                      podgroup=True)  # fmt: skip
    # Before, the workers were told rack-s has room for none of them, and the job waited out the hour.
    names = ["job-driver", "job-worker-0", "job-worker-1"]
    bound = wait_for(lambda: all_bound(cluster, namespace, names), 30, "the job bound whole")
    assert racks_of(where, bound) == {"rack-t"}
    assert_no_device_held_twice(cluster, namespace)
