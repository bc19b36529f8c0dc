"""`kubegpu simulate` as a user runs it: the JSON contract, the report, input formats and input errors."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import build_parser, main
from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler import simulate as simulate_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["simulate", "--json", *args])
    captured = capsys.readouterr()
    events = [json.loads(line) for line in captured.out.split("\n") if line.strip()]
    return code, events, captured.err


def by_pod(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["pod"]: e for e in events if e["event"] != "deleted"}


def test_neuron_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, events, _ = simulate(capsys, str(EXAMPLES / "neuron.yaml"))
    assert code == 0
    pods = by_pod(events)
    assert pods["ml/train-8"]["devices"]["trainer"]["aws.amazon.com/neurondevice"] in (
        [str(i) for i in range(8)],
        [str(i) for i in range(8, 16)],
    )
    assert (
        "Instance type trn1.32xlarge does not support requests for device: 7. Please request a different "
        "number of devices." in pods["ml/train-7"]["reason"]
    )
    assert pods["ml/train-7"]["event"] == "unschedulable"
    three = [int(i) for i in pods["ml/infer-3"]["devices"]["server"]["aws.amazon.com/neuron"]]
    assert three == list(range(three[0], three[0] + 3))


def test_intel_example_follows_the_gas_seed(capsys: pytest.CaptureFixture[str]) -> None:
    code, events, _ = simulate(capsys, str(EXAMPLES / "intel.yaml"))
    assert code == 0
    pods = by_pod(events)
    assert pods["default/media-1"]["event"] == pods["default/media-2"]["event"] == "scheduled"
    cards = {pods[f"default/media-{i}"]["annotations"]["gas-container-cards"] for i in (1, 2)}
    assert cards == {"card0", "card1"}
    third = pods["default/media-3"]
    assert (third["event"] == "unschedulable" and "per card" in third["reason"].lower()) or "card" in third["reason"]
    assert int(pods["default/media-wide"]["annotations"]["gas-ts"]) > 0


def test_nvidia_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, events, _ = simulate(capsys, str(EXAMPLES / "nvidia.yaml"))
    assert code == 0
    pods = by_pod(events)
    quad = pods["default/v100-quad"]
    assert quad["node"] == "p3-a"
    assert sorted(quad["devices"]["train"]["nvidia.com/gpu"]) in (["0", "1", "2", "3"], ["4", "5", "6", "7"])
    assert pods["default/big-memory"]["node"] == "p4d-a"
    assert "H100-SXM5-80GB" in pods["default/wants-h100"]["reason"]


def test_devices_equal_the_allocation_annotation(capsys: pytest.CaptureFixture[str]) -> None:
    _, events, _ = simulate(capsys, str(EXAMPLES / "mixed.yaml"))
    scheduled = [e for e in events if e["event"] == "scheduled" and e["devices"]]
    assert scheduled
    for event in scheduled:
        record = decode_allocation(event["annotations"][ALLOCATION_KEY])
        assert record.containers == event["devices"]
        assert record.node == event["node"]


def test_deletion_releases_devices_for_a_later_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documents = [
        node_manifest(
            "trn",
            labels={"node.kubernetes.io/instance-type": "trn1.32xlarge"},
            allocatable={"aws.amazon.com/neurondevice": 16},
        ),
        pod_manifest("all", {"main": {"aws.amazon.com/neurondevice": 16}}),
        pod_manifest("waiting", {"main": {"aws.amazon.com/neurondevice": 16}}),
        pod_manifest("all", deleted=True),
        pod_manifest("waiting", {"main": {"aws.amazon.com/neurondevice": 16}}, namespace="other"),
    ]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code, events, _ = simulate(capsys, str(path))
    assert code == 0
    assert [e["event"] for e in events] == ["scheduled", "unschedulable", "deleted", "scheduled"]
    assert events[2]["devices"] == events[0]["devices"] and events[2]["node"] == "trn"
    assert events[3]["devices"]["main"]["aws.amazon.com/neurondevice"] == [str(i) for i in range(16)]


def _replicas_documents(owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Six 8-GPU nodes, two per zone, and six one-GPU replicas of a training job (app=trainer), with their owner."""
    zone, host = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
    nodes = [
        node_manifest(f"gpu-{z}{i}", labels={zone: f"zone-{z}", host: f"gpu-{z}{i}"}, allocatable={"nvidia.com/gpu": 8})
        for z in "abc"
        for i in (1, 2)
    ]
    pods = []
    for i in range(6):
        manifest = pod_manifest(f"trainer-{i}", {"main": {"nvidia.com/gpu": 1}}, namespace="ml")
        manifest["metadata"]["labels"] = {"app": "trainer", "pod-template-hash": "7c9b"}
        pods.append(manifest)
    return [*nodes, *([owner] if owner else []), *pods]


REPLICA_SET = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "metadata": {"name": "trainer-7c9b", "namespace": "ml"},
    "spec": {"selector": {"matchLabels": {"app": "trainer", "pod-template-hash": "7c9b"}}},
}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "trainer", "namespace": "ml"},
           "spec": {"selector": {"app": "trainer"}}}  # fmt: skip


@pytest.mark.parametrize("owner", [REPLICA_SET, SERVICE], ids=["replicaset", "service"])
def test_replicas_with_an_owner_spread_over_zones_and_hosts_and_without_one_follow_binpack(
    owner: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alone, owned = tmp_path / "alone.yaml", tmp_path / "owned.yaml"
    alone.write_text(yaml.safe_dump_all(_replicas_documents(None)))
    owned.write_text(yaml.safe_dump_all(_replicas_documents(owner)))
    code, events, err = simulate(capsys, str(alone))
    assert code == 0, err
    assert [e["node"] for e in events] == ["gpu-a1"] * 6  # binpack: every replica on the node already in use
    code, events, err = simulate(capsys, str(owned))
    assert code == 0, err
    nodes = [e["node"] for e in events]
    assert sorted(nodes) == ["gpu-a1", "gpu-a2", "gpu-b1", "gpu-b2", "gpu-c1", "gpu-c2"]  # one per host
    assert sorted(node[4] for node in nodes[:3]) == ["a", "b", "c"]  # the first three in three zones
    assert all(e["devices"]["main"]["nvidia.com/gpu"] for e in events)


def _documents() -> list[dict[str, Any]]:
    return [
        node_manifest(
            "gpu",
            labels={"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "T4"},
            allocatable={"nvidia.com/gpu": 2},
        ),
        pod_manifest("a", {"main": {"nvidia.com/gpu": 1}}),
        pod_manifest("b", {"main": {"nvidia.com/gpu": 2}}),
    ]


@pytest.mark.parametrize("form", ["yaml", "json-object", "json-list", "json-lines"])
def test_input_formats_give_the_same_result(form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documents = _documents()
    path = tmp_path / "input"
    if form == "yaml":
        path.write_text(yaml.safe_dump_all(documents))
        files = [path]
    elif form == "json-object":
        files = []
        for i, document in enumerate(documents):
            single = tmp_path / f"doc{i}.json"
            single.write_text(json.dumps(document, indent=2))
            files.append(single)
    elif form == "json-list":
        path.write_text(json.dumps({"kind": "List", "apiVersion": "v1", "items": documents}))
        files = [path]
    else:
        path.write_text("\n".join(json.dumps(d) for d in documents) + "\n")
        files = [path]
    code, events, _ = simulate(capsys, *map(str, files))
    assert code == 0
    assert [(e["pod"], e["event"], e["node"]) for e in events] == [
        ("default/a", "scheduled", "gpu"),
        ("default/b", "unschedulable", None),
    ]
    assert events[1]["reason"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


IN_WITHOUT_VALUES = {"matchExpressions": [{"key": "app", "operator": "In"}]}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            pod_manifest("neg", {"main": {"nvidia.com/gpu": "-1"}}),
            "#2: Pod.spec.containers[0].resources.limits.nvidia.com/gpu: Value error, '-1' is negative",
        ),
        (
            {"kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": []}},
            "#2: Pod.spec.containers: List should have at least 1 item",
        ),
        (
            {"kind": "ConfigMap", "metadata": {"name": "x"}},
            "#2: kind: expected Node, Pod, PodDisruptionBudget, PersistentVolumeClaim, PersistentVolume, "
            "PriorityClass, Service, ReplicationController, ReplicaSet, StatefulSet, PodGroup, Topology, Namespace, "
            "DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate or List, got 'ConfigMap'",
        ),
        (pod_manifest("q", {"main": {"cpu": "lots"}}), "'lots' is not a Kubernetes quantity"),
        (
            {"kind": "Service", "metadata": {"name": "web"}, "spec": {"selector": ["app", "web"]}},
            "#2: Service.spec.selector: expected a map of labels",
        ),
        (
            {"kind": "ReplicaSet", "metadata": {"name": "web"}, "spec": {"selector": IN_WITHOUT_VALUES}},
            "#2: ReplicaSet.spec.selector.matchExpressions[0].values: operator In needs at least one value",
        ),
    ],
    ids=[
        "negative-quantity",
        "no-containers",
        "unknown-kind",
        "bad-quantity",
        "service-selector",
        "replicaset-selector",
    ],
)
def test_invalid_input_names_document_and_field(
    document: dict[str, Any], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([_documents()[0], document]))
    code, events, err = simulate(capsys, str(path))
    assert code == 2 and events == []
    assert f"{path}" in err and message.replace("Value error, ", "") in err
    assert "Traceback" not in err


def test_a_pod_naming_a_priority_class_nobody_made_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server refuses a pod whose PriorityClass does not exist; the simulator ran it at priority 0. The
    API server's own classes need no document."""
    path = tmp_path / "classes.yaml"
    node, pod = _documents()[:2]
    path.write_text(yaml.safe_dump_all([node, {**pod, "spec": {**pod["spec"], "priorityClassName": "urgent"}}]))
    code, events, err = simulate(capsys, str(path))
    assert code == 2 and events == []
    assert "#2: spec.priorityClassName: no PriorityClass 'urgent' among the documents" in err
    path.write_text(
        yaml.safe_dump_all([node, {**pod, "spec": {**pod["spec"], "priorityClassName": "system-node-critical"}}])
    )
    code, events, _ = simulate(capsys, str(path))
    assert code == 0 and [e["event"] for e in events] == ["scheduled"]


def test_a_pod_of_the_api_servers_own_priority_class_runs_at_its_priority(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """system-node-critical is 2000001000 on every API server, whether or not the input holds the class: of two pods
    wanting the same GPUs it is placed first (it would preempt the other); the simulator ran it at priority 0, after
    the other in document order, and reported it unschedulable."""
    path = tmp_path / "system.yaml"
    node = _documents()[0]
    batch = pod_manifest("batch", {"main": {"nvidia.com/gpu": 2}})
    agent = pod_manifest("agent", {"main": {"nvidia.com/gpu": 2}})
    agent["spec"]["priorityClassName"] = "system-node-critical"
    low = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "low"}, "value": 1}
    for documents in ([node, batch, agent], [low, node, batch, agent]):
        path.write_text(yaml.safe_dump_all(documents))
        code, events, _ = simulate(capsys, str(path))
        assert code == 0
        assert {e["pod"]: e["event"] for e in events} == {
            "default/agent": "scheduled",
            "default/batch": "unschedulable",
        }


def test_a_pod_scheduled_twice_without_deletion_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dup.yaml"
    docs = _documents()
    path.write_text(yaml.safe_dump_all([*docs, docs[1]]))
    code, _, err = simulate(capsys, str(path))
    assert code == 2 and "#4: metadata.name: pod default/a is already scheduled" in err


def test_report_draws_occupancy_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLES / "mixed.yaml")]) == 0
    report = capsys.readouterr().out
    assert "PLACEMENTS" in report and "DEVICE OCCUPANCY" in report and "SUMMARY" in report
    assert "4-wide grid" in report  # the trn1 torus
    assert "unschedulable pods by reason" in report
    assert "does not support requests for device: 7" in report


def test_the_report_shows_each_gpu_share_by_its_amounts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """HAMi's share pods: the placement line showed the GPU ids under the share resources (`gpucores=0, gpumem=0`
    for 30 % and 3000 MiB of GPU 0), which read as a share of nothing."""
    node = node_manifest(
        "gpu-a",
        labels={"nvidia.com/gpu.count": "3", "nvidia.com/gpu.memory": "16384"},
        allocatable={"nvidia.com/gpu": 30},
    )
    pods = [
        pod_manifest("gpu-pod", {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}}),
        pod_manifest("two", {"main": {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 10}}),
        pod_manifest("whole", {"main": {"nvidia.com/gpu": 1}}),
    ]
    path = tmp_path / "hami.yaml"
    path.write_text(yaml.safe_dump_all([node, *pods]))
    assert main(["simulate", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if " scheduled " in line}
    assert lines["default/gpu-pod"].endswith(" main: gpu=0, gpucores=30 on 0, gpumem=3000 on 0"), lines
    assert re.search(r" main: gpu=(\d,\d), gpucores=10 on \1, gpumem=2000 on \1$", lines["default/two"]), lines
    assert re.search(r" main: gpu=\d$", lines["default/whole"]), lines


def test_the_report_shows_what_an_init_container_is_given_with_its_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An init container checking a 30 % share of the GPU its app then takes whole: the placement line named the
    app's GPU alone, so the report never said the check ran on GPU 0 held to 30 % of it (the allocation's `init` and
    `shares`, which the node side applies)."""
    gpu, cores = "nvidia.com/gpu", "nvidia.com/gpucores"
    document = pod_manifest("checked", {"main": {gpu: 1}})
    document["spec"]["initContainers"] = [{"name": "check", "resources": {"limits": {gpu: "1", cores: "30"}}}]
    path = tmp_path / "init.yaml"
    path.write_text(yaml.safe_dump_all([_shared_t4_node(), document]))
    assert main(["simulate", str(path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if " scheduled " in line}
    assert re.search(r" main: gpu=(\d); check \(init\): gpu=\1, gpucores=30 on \1$", lines["default/checked"]), lines


def test_the_summary_gives_a_familys_utilisation_as_its_capacity_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four GPUs: one held whole, two each 25 % shared by one pod, one free. The summary said `3/4 devices in use
    (75%)` while `--html` and `kubegpu top` of the same cluster said 38 %: a share's GPU counted as used up."""
    node = node_manifest(
        "gpu-a",
        labels={"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "16384"},
        allocatable={"nvidia.com/gpu": 40},
    )
    pods = [
        pod_manifest("whole", {"main": {"nvidia.com/gpu": 1}}),
        pod_manifest("two", {"main": {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 25, "nvidia.com/gpumem": 1024}}),
    ]
    path = tmp_path / "shares.yaml"
    path.write_text(yaml.safe_dump_all([node, *pods]))
    assert main(["simulate", str(path)]) == 0
    (line,) = (line for line in capsys.readouterr().out.splitlines() if line.startswith("  nvidia:"))
    assert line.startswith("  nvidia: 3/4 devices in use, 38% of their capacity held, 1 free,"), line


def test_the_device_map_names_each_pod_sharing_a_gpu_with_its_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two pods share one GPU of 16 GiB, 25 % and 50 % of its memory (and a little compute): the map marked it partly
    held and named no one; a line under the map now names each sharer with its part."""
    node = node_manifest(
        "gpu-a",
        labels={"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"},
        allocatable={"nvidia.com/gpu": 10},
    )
    pods = [
        pod_manifest(name, {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 10, "nvidia.com/gpumem": mib}})
        for name, mib in (("quarter", 4096), ("half", 8192))
    ]
    path = tmp_path / "shares.yaml"
    path.write_text(yaml.safe_dump_all([node, *pods]))
    assert main(["simulate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "      0: default/half 50%, default/quarter 25%\n" in out, out


ESCAPES = "\x1b]52;c;aGk=\x07\x1b[2J\r\u202e\x9b2J"


def test_the_report_shows_names_and_reasons_from_the_input_escaped_and_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p4d = {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    documents = [node_manifest(f"p4d-{ESCAPES}[blink]" + "n" * 5000, labels=p4d, allocatable={"nvidia.com/gpu": 8})]
    documents.append(pod_manifest(f"gpu-{ESCAPES}", {"main": {"nvidia.com/gpu": 1}}))
    model = {"nvidia-gpu-scheduler/gpu.model": ESCAPES * 20_000}
    documents.append(pod_manifest("picky", {"main": {"nvidia.com/gpu": 1}}, annotations=model))
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    assert main(["simulate", str(path)]) == 0
    report = capsys.readouterr().out
    control = sorted({c for c in report if not c.isprintable() and c != "\n"})
    assert not control, f"control characters in the report: {control!r}"
    assert "gpu-\\x1b]52;c;aGk=\\x07\\x1b[2J\\r\\u202e\\x9b2J" in report and "more characters)" in report
    assert len(report) < 20_000, f"{len(report)} characters"


@pytest.mark.parametrize("hostile", ["twice-scheduled-pod", "twice-defined-node", "unknown-kind"])
def test_a_refusal_quotes_names_from_the_input_escaped_and_bounded(
    hostile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"p-{ESCAPES}" + "n" * 200_000
    documents = [node_manifest("n0", allocatable={"nvidia.com/gpu": 8})]
    if hostile == "twice-scheduled-pod":
        documents += [pod_manifest(name[:250], {"main": {"nvidia.com/gpu": 1}})] * 2
    elif hostile == "twice-defined-node":
        documents += [node_manifest(name, allocatable={"nvidia.com/gpu": 8})] * 2
    else:
        documents.append({"kind": name, "metadata": {"name": "x"}})
    path = tmp_path / "hostile.jsonl"
    path.write_text("".join(json.dumps(document) + "\n" for document in documents))

    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kubegpu simulate: invalid input: {path}")
    control = sorted({c for c in err if not c.isprintable() and c != "\n"})
    assert not control, f"control characters reach the terminal: {control!r}"
    assert len(err) < 2_000, f"{len(err)} characters"


def test_stats_are_printed_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate(capsys, "--stats", str(EXAMPLES / "nvidia.yaml"))
    stats = json.loads(err.strip().splitlines()[-1])
    assert code == 0 and stats["pod_documents"] == 4 and stats["p99_ms"] >= stats["p50_ms"] >= 0


def test_the_document_path_walks_no_full_collection_and_gives_the_thresholds_back(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything the document path builds lives until the run ends, and the engine makes almost no cyclic garbage:
    a full collection there walks every object built so far for nothing (about a tenth of `simulate_bench`'s run).
    With thresholds that would collect the oldest generation every few allocations, none runs while the files are
    read and the pods processed; young ones still do; the caller's thresholds are its own again afterwards."""
    inside = [False]
    full: list[str] = []
    young: list[str] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and inside[0]:
            (full if info["generation"] == 2 else young).append("x")

    load, process = simulate_module.load_documents, simulate_module._process

    def loading(*args: Any) -> Any:
        inside[0] = True
        try:
            return load(*args)
        finally:
            inside[0] = False

    def processing(*args: Any) -> Any:
        inside[0] = True
        try:
            yield from process(*args)
        finally:
            inside[0] = False

    monkeypatch.setattr(simulate_module, "load_documents", loading)
    monkeypatch.setattr(simulate_module, "_process", processing)
    args = build_parser(None).parse_args(["simulate", "--json", str(EXAMPLES / "mixed.yaml")])
    before = gc.get_threshold()
    # The test process's own objects out of sight (a full collection runs once the objects that survived young
    # ones reach a quarter of those the last full collection kept: none), and the oldest generation due at once.
    gc.freeze()
    gc.collect()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(count)
    try:
        code = args.func(args)
        after = gc.get_threshold()
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*before)
        gc.unfreeze()
    assert code == 0 and '"event":"scheduled"' in capsys.readouterr().out
    assert full == [], f"{len(full)} full collections while the simulator ran"
    assert young, "no young collection either"
    assert after == (1, 1, 1)


def test_every_node_is_counted_once_in_the_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trn1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
    neuron = {"aws.amazon.com/neurondevice": 16}
    documents = [node_manifest(f"trn-{i}", labels=trn1, allocatable=neuron) for i in range(3)]
    documents += [node_manifest(f"cpu-{i}") for i in range(2)]
    documents.append(pod_manifest("seven", {"main": {"aws.amazon.com/neurondevice": 7}}))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    _, events, _ = simulate(capsys, str(path))
    assert events[0]["reason"] == (
        "0/5 nodes are available: 2 Insufficient aws.amazon.com/neurondevice, 3 Instance type trn1.32xlarge does "
        "not support requests for device: 7. Please request a different number of devices.."
    )


# ------------------------------------------------------------------------------------------------------------
# Hostile input files: exit 2 with a message naming the file, in bounded time and memory (issue 10, finding 6)
# ------------------------------------------------------------------------------------------------------------

# The simulator in a child (a crash in libyaml must fail the test, not end the run), reporting its own CPU time and
# peak memory on its last stderr line. The peak is the child's own VmHWM: `ru_maxrss` of a process started by
# (v)fork and exec starts from its parent's peak, which is pytest's own after the integration tests.
_CHILD = """
import resource, sys
from kubegpu.cli import main
try:
    code = main(sys.argv[1:])
finally:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(f"usage cpu={usage.ru_utime + usage.ru_stime:.2f} peak_kib={peak}", file=sys.stderr)
raise SystemExit(code)
"""
CPU_SECONDS = 10.0  # the bombs take under a second once refused; before, minutes
PEAK_MIB = 300  # the interpreter with kubegpu loaded is about 80 MiB; the merge chain took 286 MiB at 24 levels


def simulate_child(*args: str, stdin: bytes = b"") -> tuple[int, str, float, float]:
    """(exit status, stderr without the usage line, CPU seconds, peak MiB) of `kubegpu simulate ARGS` in a child."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "simulate", *args], input=stdin, capture_output=True, timeout=120, check=False
    )
    err = done.stderr.decode(errors="replace")
    *rest, last = err.rstrip("\n").split("\n")
    usage = dict(field.split("=") for field in last.split()[1:]) if last.startswith("usage ") else {}
    assert usage, f"exit {done.returncode}, no usage line: {err[-2000:]}"
    return done.returncode, "\n".join(rest), float(usage["cpu"]), int(usage["peak_kib"]) / 1024


def _merge_chain(levels: int) -> str:
    """`m1` merges `m0` twice, `m2` merges `m1` twice...: 854 bytes at 30 levels, 2**30 keys once expanded."""
    lines = ["m0: &m0 {k0: 0, k1: 1}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


BOMBS = {
    "flow-nesting": ("x: " + "[" * 30_000 + "]" * 30_000 + "\n", "line 1: not valid YAML (nested more than 100 levels"),
    "mapping-nesting": ("x: " + "{a: " * 15_000 + "}" * 15_000 + "\n", "nested more than 100 levels deep"),
    "block-nesting": ("- " * 30_000 + "x\n", "nested more than 100 levels deep"),
    "merge-key-chain": (_merge_chain(30), "aliases stand for more than 100000 nodes"),
    "alias-chain": (
        "\n".join(["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]),
        "aliases stand for more than 100000 nodes",
    ),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_nesting_or_alias_bomb_exits_2_with_a_message_in_bounded_time_and_memory(bomb: str, tmp_path: Path) -> None:
    text, message = BOMBS[bomb]
    assert len(text.encode()) < 100_000
    path = tmp_path / f"{bomb}.yaml"
    path.write_text(text)

    code, err, cpu, peak = simulate_child(str(path))

    assert code == 2, err[-2000:]
    assert err.startswith(f"kubegpu simulate: invalid input: {path}:") and message in err
    assert "Traceback" not in err
    assert cpu < CPU_SECONDS and peak < PEAK_MIB


NESTING = f"nested more than {simulate_module.MAX_DEPTH} levels deep"


@pytest.mark.parametrize("loader", simulate_module._CHECKED_LOADERS, ids=lambda loader: loader.__name__)
@pytest.mark.parametrize("depth", [101, 999, 1001, 30_000])
@pytest.mark.parametrize("shape", ["flow", "mapping", "block"])
def test_one_wording_for_too_deep_whichever_yaml_layer_stops_it(
    shape: str, depth: int, loader: type[Any], tmp_path: Path
) -> None:
    """libyaml's scanner stops flow collections at 1000 levels (PyYAML 6.0.4 and later), PyYAML's pure-Python parser
    recurses, and the composer counts to `MAX_DEPTH`: a user reads the same sentence, with the file and the line,
    whichever gives up first, on each loader the installed PyYAML offers."""
    text = {
        "flow": "x: " + "[" * depth + "]" * depth + "\n",
        "mapping": "x: " + "{a: " * depth + "}" * depth + "\n",
        "block": "- " * depth + "x\n",
    }[shape]

    with pytest.raises(simulate_module.SimulationError) as refused:
        list(simulate_module._load_yaml(text, "deep.yaml", checked=loader))

    assert str(refused.value) == f"deep.yaml: line 1: not valid YAML ({NESTING})"


def test_yaml_nested_to_the_limit_is_read_by_every_loader() -> None:
    depth = simulate_module.MAX_DEPTH - 2  # with the document's mapping and the scalar: a hundred levels
    text = "x: " + "[" * depth + "1" + "]" * depth + "\n"
    for loader in simulate_module._CHECKED_LOADERS:
        (document,) = simulate_module._load_yaml(text, "deep.yaml", checked=loader)
        inner = document["x"]
        for _ in range(depth - 1):
            (inner,) = inner
        assert inner == [1]


@pytest.mark.parametrize("depth", [1025, 30_000])
def test_json_nested_past_orjsons_limit_is_refused_in_kubegpus_words(depth: int, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth + "\n")

    with pytest.raises(simulate_module.SimulationError) as refused:
        simulate_module.load_documents([path])

    assert str(refused.value) == (
        f"{path}: line 1: not valid JSON (nested more than {simulate_module.MAX_JSON_DEPTH} levels deep)"
    )


def test_json_nested_to_orjsons_limit_is_read_as_json(tmp_path: Path) -> None:
    depth = simulate_module.MAX_JSON_DEPTH
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth + "\n")

    with pytest.raises(simulate_module.SimulationError) as refused:
        simulate_module.load_documents([path])

    assert str(refused.value) == f"{path}#1: expected a Node or Pod object, got list"  # read, then judged


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bytes(range(256)) * 64, "standard input: binary data (a NUL byte at offset 0), not a YAML or JSON text file"),
        (b"kind: Pod\nmetadata: {name: \xff\xfe}\n", "standard input: not UTF-8 text (byte 0xff at offset 27)"),
        (b"\x89PNG\r\n\x1a\n" + bytes(200), "standard input: binary data (a NUL byte at offset 8)"),
    ],
    ids=["binary", "latin-1", "png"],
)
def test_binary_or_non_utf8_standard_input_exits_2_naming_it(data: bytes, message: str) -> None:
    code, err, cpu, peak = simulate_child("-", stdin=data)

    assert code == 2 and f"kubegpu simulate: invalid input: {message}" in err and "Traceback" not in err
    assert cpu < CPU_SECONDS and peak < PEAK_MIB


def _many_pods(tmp_path: Path, count: int) -> Path:
    documents = [node_manifest(f"n{i}", allocatable={"nvidia.com/gpu": 8}) for i in range(4)]
    documents += [pod_manifest(f"p{i}", {"main": {"nvidia.com/gpu": 1}}) for i in range(count)]
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in documents))
    return path


@pytest.mark.parametrize("form", ["--json", "report"])
def test_a_reader_that_goes_away_ends_the_run_quietly(form: str, tmp_path: Path) -> None:
    args = [str(_many_pods(tmp_path, 40))] + ([form] if form == "--json" else [])
    command = [sys.executable, "-m", "kubegpu", "simulate", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # like `| head -c 0`: every write the simulator makes meets a closed pipe
        err = child.stderr.read().decode()
        code = child.wait(timeout=60)

    assert code == 0 and err == ""


def test_head_reading_one_line_of_a_long_answer_ends_the_run_quietly(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kubegpu", "simulate", "--json", str(_many_pods(tmp_path, 1500))]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        first = json.loads(child.stdout.readline())
        child.stdout.close()  # `| head -1`: the rest (far more than a pipe holds) has nowhere to go
        err = child.stderr.read().decode()
        code = child.wait(timeout=60)

    assert first["pod"] == "default/p0" and code == 0 and err == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, resources: {limits: {cpu: "
            + "1" * 5000
            + "}}}]}\n",
            "line 3: not valid YAML (an integer of 5000 characters (at most 64))",
        ),
        ("n: " + "1:" * 3000 + "1\n", "not valid YAML (an integer of 6001 characters (at most 64))"),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, resources: {limits: {nvidia.com/gpu: "
            "1e600000}}}]}\n",
            "#1: Pod.spec.containers[0].resources.limits.nvidia.com/gpu: '1e600000' is too large",
        ),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, resources: {limits: {nvidia.com/gpu: "
            "100m}}}]}\n",
            "#1: Pod.spec.containers[0].resources.limits.nvidia.com/gpu: 0.1 is not a whole number",
        ),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a}, {name: a}]}\n",
            "#1: Pod.spec.containers[1].name: 'a' is also the name of spec.containers[0]",
        ),
        ("a: &a [*a]\n", "#1: kind: expected Node, Pod"),
        ('n: !!int ""\n', "line 1: not valid YAML (int '': string index out of range)"),
        ("t: 2001-02-30\n", "line 1: not valid YAML (timestamp '2001-02-30': day is out of range for month)"),
        (
            '{"kind": "List", "items": ' + "[" * 2000 + "]" * 2000 + "}",
            "not valid JSON (nested more than 1024 levels deep)",
        ),
    ],
    ids=[
        "5000-digit-integer",
        "base-60-integer",
        "1e600000-gpus",
        "100m-gpus",
        "duplicate-container",
        "self-alias",
        "deep-json",
        "tagged-empty-int",
        "impossible-date",
    ],
)
def test_small_hostile_files_exit_2_promptly_naming_the_field(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    started = time.thread_time()

    code, events, err = simulate(capsys, str(path))

    assert time.thread_time() - started < 2.0
    assert code == 2 and events == [] and f"invalid input: {path}" in err and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"kind: Node\nmetadata: {name: caf\xe9}\n", "not UTF-8 text (byte 0xe9 at offset 31); save it as UTF-8"),
        (b"kind: Node\x00\n", "binary data (a NUL byte at offset 10), not a YAML or JSON text file"),
        (b"\xef\xbb\xbfkind: Node\nmetadata: {name: bom}\n", None),
    ],
    ids=["latin-1-file", "nul-byte", "utf-8-bom-is-fine"],
)
def test_a_file_that_is_not_utf8_text_exits_2_naming_it(
    data: bytes, message: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "input.yaml"
    path.write_bytes(data)

    code, _, err = simulate(capsys, str(path))

    if message is None:
        assert code == 0, err
    else:
        assert code == 2 and f"kubegpu simulate: invalid input: {path}: {message}" in err


def test_input_past_the_size_and_document_bounds_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(_documents()))
    monkeypatch.setattr(simulate_module, "MAX_DOCUMENTS", 2)

    code, _, err = simulate(capsys, str(path))
    assert code == 2 and f"{path}: more than 2 YAML documents" in err

    monkeypatch.setattr(simulate_module, "MAX_INPUT_BYTES", 100)
    code, _, err = simulate(capsys, "/dev/zero")
    assert code == 2 and "/dev/zero: larger than 0 MiB" in err


def test_json_lines_break_only_at_newlines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documents = [node_manifest("gpu", allocatable={"nvidia.com/gpu": 1}), pod_manifest("a\u2028b", {"main": {}})]
    path = tmp_path / "c.jsonl"
    path.write_text("\r\n".join(json.dumps(d, ensure_ascii=False) for d in documents) + "\r\n")

    code, events, err = simulate(capsys, str(path))

    assert code == 0, err
    assert [e["pod"] for e in events] == ["default/a\u2028b"]


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"requests": {"nvidia.com/gpu": "1"}},
         "spec.containers[0].resources.limits[nvidia.com/gpu]: a limit must be set for nvidia.com/gpu"),
        ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
         "spec.containers[0].resources.requests[nvidia.com/gpu]: 1 must equal its limit 2"),
        ({"requests": {"hugepages-2Mi": "2Mi", "cpu": "1"}, "limits": {"cpu": "1"}},
         "spec.containers[0].resources.limits[hugepages-2Mi]: a limit must be set for hugepages-2Mi"),
    ],
    ids=["gpu-request-alone", "gpu-request-below-limit", "hugepages-request-alone"],
)  # fmt: skip
def test_a_device_requested_without_its_limit_is_invalid_as_the_api_server_refuses_it(
    resources: dict[str, Any], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server refuses a container that requests a resource that cannot be overcommitted (an extended
    resource such as nvidia.com/gpu, hugepages) without a limit, or with a request other than its limit; the
    simulator placed it. Its limit alone, or both equal, run."""
    path = tmp_path / "requests.yaml"
    node, pod = _documents()[:2]
    container = {**pod["spec"]["containers"][0], "resources": resources}
    path.write_text(yaml.safe_dump_all([node, {**pod, "spec": {**pod["spec"], "containers": [container]}}]))
    code, events, err = simulate(capsys, str(path))
    assert code == 2 and events == [], err
    assert f"#2: {field}" in err and "main" in err, err
    equal = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    container = {**pod["spec"]["containers"][0], "resources": equal}
    path.write_text(yaml.safe_dump_all([node, {**pod, "spec": {**pod["spec"], "containers": [container]}}]))
    code, events, err = simulate(capsys, str(path))
    assert code == 0 and [e["event"] for e in events] == ["scheduled"], err


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"requests": {"hugepages-2Mi": "4Mi"}},
         "spec.resources.limits[hugepages-2Mi]: a limit must be set for hugepages-2Mi"),
        ({"requests": {"hugepages-2Mi": "2Mi"}, "limits": {"hugepages-2Mi": "4Mi"}},
         "spec.resources.requests[hugepages-2Mi]: 2097152 must equal its limit 4194304"),
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "Pod.spec.resources.requests.cpu: 2 is above its limit 1"),
    ],
    ids=["hugepages-request-alone", "hugepages-request-below-limit", "cpu-request-above-limit"],
)  # fmt: skip
def test_pod_level_resources_the_api_server_refuses_are_invalid(
    resources: dict[str, Any], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pod-level resources (`spec.resources`, 1.32+) are checked by the API server as a container's are: hugepages
    requested without an equal limit, or a request above its limit, are refused; the simulator placed the pod,
    counting the request the cluster never runs."""
    path = tmp_path / "pod-level.yaml"
    node, pod = _documents()[:2]
    path.write_text(yaml.safe_dump_all([node, {**pod, "spec": {**pod["spec"], "resources": resources}}]))
    code, events, err = simulate(capsys, str(path))
    assert code == 2 and events == [], err
    assert f"#2: {field}" in err, err


def test_an_init_container_asking_more_gpus_than_its_app_has_them_named_and_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod whose init container checks 4 GPUs before an app of 1 (`nvidia.com/gpu: 4` on the init container, 1 on
    the app): Kubernetes counts 4 for the pod, as the kubelet gives the init container 4 and keeps them for the pod,
    the app's one taken from them. The allocation names the init container's 4 (the app's among them), each held once,
    so a 4-GPU pod after it gets the other 4 and a fifth GPU is left to nobody."""
    gpu = "nvidia.com/gpu"
    checked = pod_manifest("checked", {"main": {gpu: 1}})
    checked["spec"]["initContainers"] = [{"name": "gpu-check", "resources": {"limits": {gpu: "4"}}}]
    documents = [
        node_manifest("p3", labels={"nvidia.com/gpu.count": "8"}, allocatable={gpu: 8}),
        checked,
        pod_manifest("next", {"main": {gpu: 4}}),
        pod_manifest("one-more", {"main": {gpu: 1}}),
    ]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code, events, _ = simulate(capsys, str(path))
    assert code == 0
    pods = by_pod(events)
    assert [pods[f"default/{n}"]["event"] for n in ("checked", "next", "one-more")] == [
        "scheduled", "scheduled", "unschedulable"
    ]  # fmt: skip
    record = decode_allocation(pods["default/checked"]["annotations"][ALLOCATION_KEY])
    held = [i for resources in record.containers.values() for i in resources.get(gpu, [])]
    assert len(held) == len(set(held)) == 4  # the engine's count of the pod, every GPU named once
    init = record.init["gpu-check"][gpu]
    assert sorted(init) == sorted(held) and set(record.containers["main"][gpu]) <= set(init)
    assert set(pods["default/next"]["devices"]["main"][gpu]).isdisjoint(held)


def _shared_t4_node(name: str = "gpu-a") -> dict[str, Any]:
    """Two T4s offered for shares as HAMi's device plugin advertises them: `nvidia.com/gpu` = GPUs x 10."""
    allocatable = {"nvidia.com/gpu": 20, "nvidia.com/gpucores": 200, "nvidia.com/gpumem-percentage": 200}
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "T4"}
    return node_manifest(name, labels=labels, allocatable=allocatable)


def _with_init(name: str, init: dict[str, Any], app: dict[str, Any]) -> dict[str, Any]:
    document = pod_manifest(name, {"main": app})
    document["spec"]["initContainers"] = [{"name": "check", "resources": {"limits": init}}]
    return document


def test_an_init_container_asking_a_share_beside_an_app_asking_a_whole_gpu_gets_its_share_of_that_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A HAMi user's pod: an init container checks a 30 % share of a GPU (`nvidia.com/gpu: 1`,
    `nvidia.com/gpucores: 30`) before the app takes a whole GPU. The kubelet gives the app the init container's GPU
    slot, so the pod holds one GPU: the app's, whole; the init container is given 30 % of it. A whole-GPU pod after it
    gets the other GPU and a third finds none, until the pod is deleted: nothing held twice, nothing leaked."""
    gpu, cores = "nvidia.com/gpu", "nvidia.com/gpucores"
    checked = _with_init("checked", {gpu: "1", cores: "30"}, {gpu: "1"})
    gone = _with_init("checked", {gpu: "1", cores: "30"}, {gpu: "1"})
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    documents = [
        _shared_t4_node(),
        checked,
        pod_manifest("whole", {"main": {gpu: 1}}),
        pod_manifest("third", {"main": {gpu: 1}}),
        gone,
        pod_manifest("after", {"main": {gpu: 1}}),
    ]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code, events, _ = simulate(capsys, str(path))
    assert code == 0
    outcomes = [(e["pod"], e["event"], e["reason"]) for e in events]
    assert [(pod, event) for pod, event, _ in outcomes] == [
        ("default/checked", "scheduled"), ("default/whole", "scheduled"), ("default/third", "unschedulable"),
        ("default/checked", "deleted"), ("default/after", "scheduled"),
    ], outcomes  # fmt: skip
    pods = by_pod(events)
    record = decode_allocation(pods["default/checked"]["annotations"][ALLOCATION_KEY])
    (held,) = record.containers["main"][gpu]
    assert record.containers == {"main": {gpu: [held]}}  # the pod holds the app's GPU, whole, and nothing else
    assert record.init == {"check": {gpu: [held]}}
    assert record.shares == {"check": {cores: {held: 30}}}  # its share of that GPU
    assert pods["default/whole"]["devices"]["main"][gpu] != [held]
    assert pods["default/after"]["devices"]["main"][gpu] == [held]


def test_an_init_container_asking_whole_gpus_beside_an_app_share_is_refused_naming_the_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An init container asking 2 whole GPUs before an app asking a 50 % share, on an empty 2-GPU shared node. The
    kubelet admits it (its count: 2 of 20 `nvidia.com/gpu`, 50 of 200 `gpucores`) and hands the app one of the init
    container's GPUs; kubegpu gives a GPU whole or shared, so the pod could hold one GPU whole and a share of the
    other, and the init container could be given neither as it asks. It was placed with the init container named
    nothing (the node side then gave it no GPU); it is refused, saying what to change, and the GPUs stay free."""
    gpu, cores = "nvidia.com/gpu", "nvidia.com/gpucores"
    documents = [
        _shared_t4_node(),
        _with_init("checked", {gpu: "2"}, {gpu: "1", cores: "50"}),
        pod_manifest("two", {"main": {gpu: 2}}),
    ]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code, events, _ = simulate(capsys, str(path))
    assert code == 0
    pods = by_pod(events)
    checked = pods["default/checked"]
    assert checked["event"] == "unschedulable", checked
    assert (
        "init container check asks 2 whole GPU(s), and the pod holds 1 GPU(s) whole beside the GPU share(s) of main"
        in (checked["reason"])
    )
    assert pods["default/two"]["event"] == "scheduled"


def test_a_bound_pod_whose_init_container_was_lent_a_share_is_read_back_holding_the_apps_gpu_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ledger and the allocation agree: the pod above, read back bound with its allocation (a scheduler that
    restarts), holds the app's GPU whole and nothing of the init container's share beside it, so a one-GPU pod gets
    the other GPU and a two-GPU pod finds no room."""
    gpu, cores = "nvidia.com/gpu", "nvidia.com/gpucores"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all([_shared_t4_node(), _with_init("checked", {gpu: "1", cores: "30"}, {gpu: "1"})]))
    code, events, _ = simulate(capsys, str(path))
    assert code == 0 and events[0]["event"] == "scheduled", events
    bound = _with_init("checked", {gpu: "1", cores: "30"}, {gpu: "1"})
    bound["metadata"]["annotations"] = events[0]["annotations"]
    bound["spec"]["nodeName"] = "gpu-a"
    (held,) = decode_allocation(events[0]["annotations"][ALLOCATION_KEY]).containers["main"][gpu]
    documents = [
        _shared_t4_node(),
        bound,
        pod_manifest("two", {"main": {gpu: 2}}),
        pod_manifest("one", {"main": {gpu: 1}}),
    ]
    path.write_text(yaml.safe_dump_all(documents))
    code, events, _ = simulate(capsys, str(path))
    assert code == 0
    pods = by_pod(events)
    assert [pods[f"default/{n}"]["event"] for n in ("checked", "two", "one")] == [
        "scheduled",
        "unschedulable",
        "scheduled",
    ]
    assert pods["default/one"]["devices"]["main"][gpu] != [held]


@pytest.mark.parametrize("tier", ["prod", "dev"])
def test_namespace_documents_give_the_labels_a_namespace_selector_reads(
    tier: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU pod keeping off the hosts of every `tier: prod` namespace's pods: the Namespace document in the input
    says whether team-a's pod counts."""
    host = "kubernetes.io/hostname"
    nodes = [node_manifest(n, labels={host: n}, allocatable={"nvidia.com/gpu": 8}) for n in ("gpu-1", "gpu-2")]
    first = pod_manifest("db", {"main": {"nvidia.com/gpu": 1}}, namespace="team-a")
    term = {"topologyKey": host, "labelSelector": {}, "namespaceSelector": {"matchLabels": {"tier": "prod"}}}
    second = pod_manifest("job", {"main": {"nvidia.com/gpu": 1}}, namespace="team-b")
    second["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"tier": tier}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all([*nodes, namespace, first, second]))
    code, events, err = simulate(capsys, str(path))
    assert code == 0, err
    nodes_of = {e["pod"]: e["node"] for e in events}
    assert nodes_of["team-a/db"] == "gpu-1"
    assert nodes_of["team-b/job"] == ("gpu-2" if tier == "prod" else "gpu-1")  # binpack, unless kept off


def test_a_namespace_document_without_the_name_label_is_still_selected_by_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server sets `kubernetes.io/metadata.name` on every Namespace (1.21+), so a term selecting namespaces by
    that label selects a declared namespace whose document lists other labels only, as it does an undeclared one
    (before: team-a, declared with `tier: dev`, lost the name label, and the job went next to its pod)."""
    host = "kubernetes.io/hostname"
    nodes = [node_manifest(n, labels={host: n}, allocatable={"nvidia.com/gpu": 8}) for n in ("gpu-1", "gpu-2")]
    first = pod_manifest("db", {"main": {"nvidia.com/gpu": 1}}, namespace="team-a")
    named = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]}
    term = {"topologyKey": host, "labelSelector": {}, "namespaceSelector": named}
    second = pod_manifest("job", {"main": {"nvidia.com/gpu": 1}}, namespace="team-b")
    second["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"tier": "dev"}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all([*nodes, namespace, first, second]))
    code, events, err = simulate(capsys, str(path))
    assert code == 0, err
    nodes_of = {e["pod"]: e["node"] for e in events}
    assert nodes_of == {"team-a/db": "gpu-1", "team-b/job": "gpu-2"}
