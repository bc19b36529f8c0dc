"""`kubegpu simulate` with gangs: a user hands it racks, a Kueue Topology, PodGroups and their pods, and reads where
each gang went, which racks hold which gangs, and why a gang is left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.testing import node_manifest, pod_manifest

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"


def nodes(racks: list[int]) -> list[dict[str, Any]]:
    return [
        node_manifest(
            f"r{r}-n{i}", labels={RACK: f"rack-{r}", "kubernetes.io/hostname": f"r{r}-n{i}"}, allocatable={GPU: 8}
        )
        for r, count in enumerate(racks)
        for i in range(count)
    ]


def topology() -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Topology",
        "metadata": {"name": "default"},
        "spec": {"levels": [{"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]},
    }


def podgroup(name: str, min_member: int, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"minMember": min_member},
    }


def workers(gang: str, count: int, priority: int = 0) -> list[dict[str, Any]]:
    pods = []
    for i in range(count):
        document = pod_manifest(f"{gang}-{i}", {"main": {GPU: 8}})
        document["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": gang, "apps.kubernetes.io/pod-index": str(i)}
        document["spec"]["priority"] = priority
        pods.append(document)
    return pods


def run(tmp_path: Path, documents: list[dict[str, Any]], *args: str, capsys: Any) -> tuple[int, str, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code = main(["simulate", str(path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_gang_lands_whole_in_the_rack_that_fits_it_best_and_names_its_gang(tmp_path: Path, capsys: Any) -> None:
    required = {"kueue.x-k8s.io/podset-required-topology": RACK}
    documents = [*nodes([16, 6]), topology(), podgroup("train", 4, **required), *workers("train", 4)]
    code, out, _ = run(tmp_path, documents, "--json", capsys=capsys)
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["pod"], e["event"], e["gang"]) for e in events] == [
        (f"default/train-{i}", "scheduled", "default/train") for i in range(4)
    ]
    assert [e["node"] for e in events] == [f"r1-n{i}" for i in range(4)]


def test_an_unplaceable_gang_holds_nothing_and_the_report_says_why(tmp_path: Path, capsys: Any) -> None:
    required = {"kueue.x-k8s.io/podset-required-topology": RACK}
    documents = [
        *nodes([12, 8]),
        topology(),
        podgroup("train-7", 16, **required),
        podgroup("small", 8, **required),
        *workers("train-7", 16),
        *workers("small", 8),
    ]
    code, out, _ = run(tmp_path, documents, capsys=capsys)
    assert code == 0
    assert "GANGS (domains by example.com/rack)" in out
    assert "rack-1                       8 nodes  default/small (8)" in out
    assert (
        "unplaced default/train-7: gang default/train-7: 16 members need 8 nvidia.com/gpu each; the largest rack "
        "(rack-0) has 12 such nodes free"
    ) in out
    html = tmp_path / "report.html"
    code, _, _ = run(tmp_path, documents, "--html", str(html), "--json", capsys=capsys)
    page = html.read_text()
    assert '<section id="gangs"><h2>Gangs by example.com/rack</h2>' in page and "default/train-7" in page


def test_members_that_never_all_arrive_are_listed_with_their_gang(tmp_path: Path, capsys: Any) -> None:
    documents = [*nodes([4]), podgroup("late", 3), *workers("late", 2)]
    code, out, _ = run(tmp_path, documents, "--json", capsys=capsys)
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert {e["event"] for e in events} == {"unschedulable"}
    assert events[0]["reason"].startswith("gang default/late: 2 of minMember 3 members arrived; none holds a place")


def test_a_high_priority_gang_preempts_one_rack(tmp_path: Path, capsys: Any) -> None:
    low = []
    for i in range(4):
        document = pod_manifest(f"low-{i}", {"main": {GPU: 8}})
        document["spec"]["nodeName"] = f"r0-n{i}" if i < 2 else f"r1-n{i - 2}"
        low.append(document)
    required = {"kueue.x-k8s.io/podset-required-topology": RACK}
    documents = [*nodes([2, 2]), *low, podgroup("urgent", 2, **required), *workers("urgent", 2, priority=100)]
    code, out, _ = run(tmp_path, documents, "--json", capsys=capsys)
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    preempted = [e for e in events if e["event"] == "preempted"]
    assert len(preempted) == 2 and {e["by"] for e in preempted} == {"default/urgent"}
    assert len({e["node"].split("-")[0] for e in preempted}) == 1
    assert [e["event"] for e in events if e.get("gang")] == ["scheduled", "scheduled"]


def test_a_high_priority_pod_preempts_a_running_gang_whole_not_one_member(tmp_path: Path, capsys: Any) -> None:
    """One worker evicted left the other running below minMember, holding its GPUs for a job that could not go on."""
    running = workers("train", 2)
    for i, worker in enumerate(running):
        worker["spec"]["nodeName"] = f"r0-n{i}"
    high = pod_manifest("high", {"main": {GPU: 8}})
    high["spec"]["priority"] = 100
    documents = [*nodes([2]), podgroup("train", 2), *running, high]
    code, out, _ = run(tmp_path, documents, "--json", capsys=capsys)
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    preempted = {e["pod"]: e["by"] for e in events if e["event"] == "preempted"}
    assert preempted == {"default/train-0": "default/high", "default/train-1": "default/high"}
    assert ("default/high", "scheduled") in [(e["pod"], e["event"]) for e in events]


def test_a_member_given_twice_while_its_gang_gathers_is_refused_not_counted_twice(tmp_path: Path, capsys: Any) -> None:
    """A file that creates `train-0` twice before `train-1` (the API server answers the second AlreadyExists): the
    gang of minMember 2 was placed with `train-0` counted twice, one member short, and `train-0` printed scheduled
    twice on the same GPUs; the copy is refused as a copy of a scheduled pod is."""
    documents = [*nodes([2]), podgroup("train", 2), *workers("train", 1), *workers("train", 2)]
    code, out, err = run(tmp_path, documents, "--json", capsys=capsys)
    assert (code, out) == (2, ""), out
    assert "#5: metadata.name: pod default/train-0 is already waiting for its gang; delete it first" in err
    deleted = {**workers("train", 1)[0]}
    deleted["metadata"] = {**deleted["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}
    code, out, _ = run(tmp_path, [*documents[:4], deleted, *workers("train", 2)], "--json", capsys=capsys)
    events = [(e["pod"], e["event"]) for e in map(json.loads, out.splitlines())]
    assert code == 0 and events == [
        ("default/train-0", "deleted"),
        ("default/train-0", "scheduled"),
        ("default/train-1", "scheduled"),
    ]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (podgroup("bad", 0), "PodGroup.spec.minMember: 0 is out of range"),
        ({**topology(), "spec": {"levels": []}}, "Topology.spec.levels: expected a list of 1 to 16 levels"),
    ],
    ids=["podgroup", "topology"],
)
def test_a_malformed_gang_document_exits_2_naming_the_field(
    tmp_path: Path, capsys: Any, document: dict[str, Any], message: str
) -> None:
    code, _, err = run(tmp_path, [*nodes([1]), document], capsys=capsys)
    assert code == 2 and message in err


def test_names_and_racks_of_odd_digits_are_ordered_as_text(tmp_path: Path, capsys: Any) -> None:
    """A file's pod named `train-1²` and a rack labelled `rack-1²` (`²` is a digit to `str.isdigit`, not to `int`),
    another of 5000 digits: the natural order of gang members and domains read them as numbers and the run died
    with a ValueError."""
    required = {"kueue.x-k8s.io/podset-required-topology": RACK}
    racks = nodes([2, 2])
    for node in racks[:2]:
        node["metadata"]["labels"][RACK] = "rack-1²"
    for node in racks[2:]:
        node["metadata"]["labels"][RACK] = "rack-" + "9" * 5000  # past the 4300 digits int() reads
    members = workers("train", 2)
    members[1]["metadata"]["name"] = "train-1²"
    code, out, err = run(
        tmp_path, [*racks, topology(), podgroup("train", 2, **required), *members], "--json", capsys=capsys
    )
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert sorted((e["pod"], e["event"]) for e in events) == [
        ("default/train-0", "scheduled"),
        ("default/train-1²", "scheduled"),
    ]


def test_a_cluster_one_node_short_of_a_64_worker_gang_places_none_and_the_report_says_so(
    tmp_path: Path, capsys: Any
) -> None:
    documents = [*nodes([16, 16, 16, 15]), topology(), podgroup("train", 64), *workers("train", 64)]
    code, out, _ = run(tmp_path, documents, capsys=capsys)
    assert code == 0
    assert "scheduled 0, unschedulable 64" in out, "none of the 64 holds anything"
    assert "GANGS (none placed)" in out and "domains by -" not in out
    assert (
        "unplaced default/train: gang default/train: 64 members need 8 nvidia.com/gpu each; the cluster has 63 "
        "such nodes free"
    ) in out
    html = tmp_path / "report.html"
    run(tmp_path, documents, "--html", str(html), "--json", capsys=capsys)
    page = html.read_text()
    assert '<section id="gangs"><h2>Gangs (none placed)</h2><h3>Gangs not placed</h3>' in page, page
