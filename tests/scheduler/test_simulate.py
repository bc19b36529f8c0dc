"""`kubegpu simulate` as a user runs it: the JSON contract, the report, input formats and input errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation
from kubegpu.core.testing import node_manifest, pod_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["simulate", "--json", *args])
    captured = capsys.readouterr()
    events = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
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
            {"kind": "Service", "metadata": {"name": "x"}},
            "#2: kind: expected Node, Pod, PodDisruptionBudget, PersistentVolumeClaim, PersistentVolume, PriorityClass or List, got 'Service'",
        ),
        (pod_manifest("q", {"main": {"cpu": "lots"}}), "'lots' is not a Kubernetes quantity"),
    ],
    ids=["negative-quantity", "no-containers", "unknown-kind", "bad-quantity"],
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


def test_stats_are_printed_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate(capsys, "--stats", str(EXAMPLES / "nvidia.yaml"))
    stats = json.loads(err.strip().splitlines()[-1])
    assert code == 0 and stats["pod_documents"] == 4 and stats["p99_ms"] >= stats["p50_ms"] >= 0


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
