"""What users of the seed systems keep when they switch to `kubegpu extender`: GAS's flag names, nvidia-gpu-scheduler's
views, watch streams and score, and the Neuron extension's filter decisions in the log."""

from __future__ import annotations

import argparse
import json
import logging
import socket
from collections.abc import Iterator

import orjson
import pytest

from kubegpu.cli import build_parser
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import LogfmtFormatter
from kubegpu.core.testing import make_node, make_pod, pod_manifest
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import compat
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import ExtenderHttpServer, ExtenderServer, _gas_flags

from .test_extender_http import read_response

V100 = "Tesla-V100-SXM2-16GB"
A100 = "NVIDIA-A100-SXM4-40GB"
MODEL = "nvidia-gpu-scheduler/gpu.model"


def gpu_node(name: str, product: str, count: int = 8) -> object:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.memory": "16160"}
    return make_node(name, labels=labels, allocatable={"nvidia.com/gpu": str(count)})


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["extender", "--allocation-key-file", "k", *argv])


# -- GAS's flags --------------------------------------------------------------------------------------------------


def test_gas_flag_names_set_the_same_options() -> None:
    args = parse("--port", "9001", "--cert", "c.pem", "--key", "k.pem", "--cacert", "ca.pem", "--kubeConfig", "kc")
    assert _gas_flags(args) == []
    assert (args.listen, args.tls_cert, args.tls_key, args.client_ca, args.kubeconfig) == (
        "0.0.0.0:9001", "c.pem", "k.pem", "ca.pem", "kc",
    )  # fmt: skip
    go_style = parse("-port", "32000", "-cert=c.pem", "-key=k.pem", "-cacert=ca.pem")
    _gas_flags(go_style)
    assert (go_style.listen, go_style.tls_cert, go_style.client_ca) == ("0.0.0.0:32000", "c.pem", "ca.pem")


def test_gas_deployments_command_line_is_taken_as_written() -> None:
    """GAS's deploy/gas-deployment.yaml passes `--v=4`, and its flags include `-enableAllowlist`, `-enableDenylist`,
    `-qps`, `-burst`: `kubegpu extender` stopped at the first with `unrecognized arguments`."""
    args = parse(
        "--cert=/gas/cert/tls.crt", "--key=/gas/cert/tls.key",
        "--cacert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "--v=4",
        "-enableAllowlist", "--enableDenylist=true", "-qps=5", "-burst", "10", "--balancedResource=",
    )  # fmt: skip
    assert _gas_flags(args) == []
    assert (args.tls_cert, args.client_ca, args.log_level) == (
        "/gas/cert/tls.crt", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "info",
    )  # fmt: skip
    assert (args.kube_api_qps, args.kube_api_burst) == (5.0, 10)
    _gas_flags(debug := parse("-v=5"))
    assert debug.log_level == "debug"


def test_gas_flags_kubegpu_does_not_follow_are_refused_or_said() -> None:
    warnings = _gas_flags(parse("--enableAllowlist=false"))
    assert warnings == ["--enableAllowlist=false: kubegpu honours every pod's gas-allow annotation all the same"]
    with pytest.raises(SystemExit, match=r"--balancedResource=millicores .* is not supported: .* remove the flag"):
        _gas_flags(parse("--balancedResource", "millicores"))


def test_without_port_or_listen_the_default_stays() -> None:
    args = parse()
    _gas_flags(args)
    assert args.listen == "0.0.0.0:8888" and not args.insecure_no_client_auth


@pytest.mark.parametrize("spelling", [["--unsafe"], ["--unsafe=true"], ["-unsafe"], ["--unsafe", "true"]])
def test_unsafe_means_plain_http_without_client_auth_and_says_so(spelling: list[str]) -> None:
    args = parse(*spelling, "--cert", "c.pem", "--key", "k.pem", "--cacert", "ca.pem")
    warnings = _gas_flags(args)
    assert args.insecure_no_client_auth and (args.tls_cert, args.tls_key, args.client_ca) == (None, None, None)
    assert any("--insecure-no-client-auth" in w for w in warnings)
    assert any("--cert, --key, --cacert ignored" in w for w in warnings)


def test_unsafe_false_changes_nothing() -> None:
    args = parse("--unsafe=false", "--cacert", "ca.pem")
    assert _gas_flags(args) == [] and args.client_ca == "ca.pem" and not args.insecure_no_client_auth


def test_port_and_listen_together_are_refused() -> None:
    with pytest.raises(SystemExit, match="--listen or GAS's --port, not both"):
        _gas_flags(parse("--port", "9001", "--listen", "127.0.0.1:1"))
    with pytest.raises(SystemExit, match="not a TCP port"):
        _gas_flags(parse("--port", "70000"))


def test_intel_without_i915_takes_refuse_or_ignore() -> None:
    assert parse("--intel-without-i915", "ignore").intel_without_i915 == "ignore"
    with pytest.raises(SystemExit):
        parse("--intel-without-i915", "maybe")


# -- nvidia-gpu-scheduler's views, watch streams and score ----------------------------------------------------------


@pytest.fixture
def stack() -> Iterator[tuple[ExtenderServer, ExtenderHttpServer]]:
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia), ("neuron", neuron)], autoload=False)
    engine = Engine(pm)
    engine.add_node(gpu_node("v100-0", V100))  # type: ignore[arg-type]
    engine.add_node(gpu_node("v100-1", V100))  # type: ignore[arg-type]
    engine.add_node(gpu_node("a100-0", A100))  # type: ignore[arg-type]
    server = ExtenderServer(engine, None, None, policy=compat.FREE_MODEL_GPUS)  # type: ignore[arg-type]
    http = ExtenderHttpServer(server, "127.0.0.1:0", None)
    yield server, http
    http.shutdown()


def get(http: ExtenderHttpServer, path: str) -> tuple[int, dict[str, object]]:
    with socket.create_connection(http.address, timeout=5) as sock:  # type: ignore[arg-type]
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _, body = read_response(sock, bytearray())
    return status, orjson.loads(body)


def post(http: ExtenderHttpServer, path: str, document: object) -> object:
    body = orjson.dumps(document)
    with socket.create_connection(http.address, timeout=5) as sock:  # type: ignore[arg-type]
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        status, _, answer = read_response(sock, bytearray())
    assert status == 200, answer
    return orjson.loads(answer)


def test_gpunodes_and_gpupods_list_gpus_by_model_and_holder(stack: tuple[ExtenderServer, ExtenderHttpServer]) -> None:
    server, http = stack
    pod = make_pod(
        "train", {"main": {"nvidia.com/gpu": 2}}, namespace="ml", annotations={MODEL: "tesla-v100-sxm2-16gb"}
    )
    decision = server.engine.reserve(pod, "v100-1")
    assert decision.scheduled
    status, nodes = get(http, compat.GPUNODES)
    assert status == 200
    by_name = {item["name"]: item for item in nodes["items"]}  # type: ignore[attr-defined]
    assert set(by_name) == {"v100-0", "v100-1", "a100-0"}
    assert by_name["v100-1"]["models"] == {V100: {"total": 8, "free": 6}}
    assert by_name["a100-0"]["models"] == {A100: {"total": 8, "free": 8}}
    held = [g for g in by_name["v100-1"]["gpus"] if g["pod"]]
    assert [g["pod"] for g in held] == ["ml/train", "ml/train"] and all(g["model"] == V100 for g in held)
    status, pods = get(http, compat.GPUPODS)
    (item,) = pods["items"]  # type: ignore[misc]
    assert item["kind"] == "GpuPod" and item["metadata"]["name"] == "train" and item["node"] == "v100-1"
    assert sorted(g["id"] for g in item["gpus"]) == sorted(decision.allocation.containers["main"]["nvidia.com/gpu"])
    assert {g["model"] for g in item["gpus"]} == {V100}


def test_a_pod_held_by_count_shows_no_guessed_gpu_ids_until_its_ids_are_published(
    stack: tuple[ExtenderServer, ExtenderHttpServer],
) -> None:
    """A pod bound by another scheduler holds 2 GPUs by count: the kubelet picked them, kubegpu's ledger set aside two
    of its own choosing. The views show what is known (two V100s taken, by whom; not which), and once the node side
    publishes the kubelet's ids, exactly those."""
    server, http = stack
    pod = make_pod("foreign", {"main": {"nvidia.com/gpu": 2}}, namespace="ml")
    with server.mirror.lock:
        assert server.engine.admit_by_count(pod, "v100-0").scheduled

    _, pods = get(http, compat.GPUPODS)
    (item,) = pods["items"]  # type: ignore[misc]
    assert item["byCount"] is True
    assert item["gpus"] == [{"container": "main", "id": None, "model": V100}] * 2
    _, nodes = get(http, compat.GPUNODES)
    (node,) = [n for n in nodes["items"] if n["name"] == "v100-0"]  # type: ignore[attr-defined]
    assert [g["pod"] for g in node["gpus"]] == [None] * 8
    assert node["heldByCount"] == {"ml/foreign": 2} and node["models"] == {V100: {"total": 8, "free": 6}}

    with server.mirror.lock:
        server.engine.set_held_devices("v100-0", {"ml/foreign": {"main": {"nvidia.com/gpu": ["5", "7"]}}})

    _, pods = get(http, compat.GPUPODS)
    (item,) = pods["items"]  # type: ignore[misc]
    assert item["byCount"] is False and sorted(g["id"] for g in item["gpus"]) == ["5", "7"]
    _, nodes = get(http, compat.GPUNODES)
    (node,) = [n for n in nodes["items"] if n["name"] == "v100-0"]  # type: ignore[attr-defined]
    assert {g["id"]: g["pod"] for g in node["gpus"] if g["pod"]} == {"5": "ml/foreign", "7": "ml/foreign"}
    assert node["heldByCount"] == {}


def test_kubegpus_own_views_of_a_pod_held_by_count_show_no_guessed_ids_either(
    stack: tuple[ExtenderServer, ExtenderHttpServer],
) -> None:
    """`/apis/kubegpu/v1/pods` and `/nodes` say what `gpupods` and `gpunodes` say of a pod held by count: `byCount`
    and a null id for each device set aside, no holder on any particular GPU but the count under `heldByCount`; once
    the node side publishes the kubelet's ids, exactly those (before: the ledger's guess, "0" and "1", as if known)."""
    server, http = stack
    pod = make_pod("foreign", {"main": {"nvidia.com/gpu": 2}}, namespace="ml")
    with server.mirror.lock:
        assert server.engine.admit_by_count(pod, "v100-0").scheduled

    _, pods = get(http, "/apis/kubegpu/v1/pods")
    (item,) = pods["items"]  # type: ignore[misc]
    assert item["devices"] == {"main": {"nvidia.com/gpu": [None, None]}}, item
    assert item["byCount"] is True
    _, nodes = get(http, "/apis/kubegpu/v1/nodes")
    (node,) = [n for n in nodes["items"] if n["name"] == "v100-0"]  # type: ignore[attr-defined]
    (gpus,) = node["devices"]
    assert [c["holders"] for c in gpus["cells"]] == [[]] * 8 and gpus["free"] == 6
    assert node["heldByCount"] == {"ml/foreign": 2} and node["pods"] == ["ml/foreign"]

    with server.mirror.lock:
        server.engine.set_held_devices("v100-0", {"ml/foreign": {"main": {"nvidia.com/gpu": ["5", "7"]}}})

    _, pods = get(http, "/apis/kubegpu/v1/pods")
    (item,) = pods["items"]  # type: ignore[misc]
    assert (item["byCount"], item["devices"]) == (False, {"main": {"nvidia.com/gpu": ["5", "7"]}})
    _, nodes = get(http, "/apis/kubegpu/v1/nodes")
    (node,) = [n for n in nodes["items"] if n["name"] == "v100-0"]  # type: ignore[attr-defined]
    assert {c["id"]: c["holders"] for c in node["devices"][0]["cells"] if c["holders"]} == {
        "5": ["ml/foreign"],
        "7": ["ml/foreign"],
    }
    assert node["heldByCount"] == {}


def test_a_gpupods_watch_streams_the_pod_when_it_is_placed(stack: tuple[ExtenderServer, ExtenderHttpServer]) -> None:
    server, http = stack
    with socket.create_connection(http.address, timeout=10) as sock:  # type: ignore[arg-type]
        sock.sendall(f"GET {compat.GPUPODS}?watch=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(4096)
        with server.mirror.lock:
            server.engine.reserve(
                make_pod("watched", {"main": {"nvidia.com/gpu": 1}}, annotations={MODEL: A100}), "a100-0"
            )
        while b'"kind":"GpuPod"' not in buffer:
            buffer += sock.recv(4096)
    line = next(part for part in buffer.split(b"\r\n") if b"GpuPod" in part)
    event = json.loads(line.split(b"\n")[0])
    assert event["type"] == "ADDED" and event["object"]["node"] == "a100-0"


def test_the_aggregation_layer_finds_its_discovery_document(stack: tuple[ExtenderServer, ExtenderHttpServer]) -> None:
    _, http = stack
    status, document = get(http, "/apis/nvidia-gpu-scheduler/v1")
    assert status == 200 and document["groupVersion"] == "nvidia-gpu-scheduler/v1"
    assert {r["name"] for r in document["resources"]} == {"gpupods", "gpunodes", "schedule"}  # type: ignore[union-attr]


def test_the_views_need_a_client_certificate_like_the_monitoring_api() -> None:
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    extender = ExtenderServer(Engine(pm), None, None)  # type: ignore[arg-type]
    guarded = ExtenderHttpServer(extender, "127.0.0.1:0", None, client_auth=True)
    try:
        for path in (compat.GPUPODS, compat.GPUNODES, f"{compat.GPUPODS}?watch=true", compat.PREFIX):
            status, document = get(guarded, path)
            assert status == 401 and "client certificate" in str(document["error"])
    finally:
        guarded.shutdown()


def test_free_model_gpus_scores_by_the_free_gpus_of_the_asked_model(
    stack: tuple[ExtenderServer, ExtenderHttpServer],
) -> None:
    server, http = stack
    server.engine.reserve(make_pod("busy", {"main": {"nvidia.com/gpu": 4}}), "v100-0")
    manifest = pod_manifest("pick", {"main": {"nvidia.com/gpu": 1}}, annotations={MODEL: V100})
    args = {"Pod": manifest, "NodeNames": ["v100-0", "v100-1", "a100-0"]}
    # The seed's urlPrefix, .../apis/nvidia-gpu-scheduler/v1/schedule, works as it is: the last segment is the verb.
    filtered = post(http, "/apis/nvidia-gpu-scheduler/v1/schedule/filter", args)
    assert filtered["NodeNames"] == ["v100-0", "v100-1"]  # type: ignore[index]
    assert filtered["FailedNodes"] == {"a100-0": f'node(s) have no GPU of model "{V100}"'}  # type: ignore[index]
    scores = post(http, "/apis/nvidia-gpu-scheduler/v1/schedule/prioritize", args)
    assert scores == [{"Host": "v100-0", "Score": 4}, {"Host": "v100-1", "Score": 8}]


# -- the Neuron extension's verify step: filter decisions in the log -------------------------------------------------


def test_every_filter_decision_is_logged_with_nodes_passed_and_refused_by_reason(
    stack: tuple[ExtenderServer, ExtenderHttpServer], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = stack
    manifest = pod_manifest("pick", {"main": {"nvidia.com/gpu": 1}}, namespace="ml", annotations={MODEL: A100})
    with caplog.at_level(logging.INFO, logger="kubegpu.extender"):
        server.filter(orjson.dumps({"Pod": manifest, "NodeNames": ["v100-0", "a100-0", "v100-1", "ghost"]}))
    (record,) = [r for r in caplog.records if r.getMessage() == "filter"]
    line = LogfmtFormatter().format(record)
    assert "pod=ml/pick" in line and "passed=a100-0" in line
    assert (
        f'failed="2 node(s) node(s) have no GPU of model \\"{A100}\\" [v100-0,v100-1]; '
        '1 node(s) node(s) unknown to kubegpu (not in its node cache yet) [ghost]"'
    ) in line
