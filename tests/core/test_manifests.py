"""Node and Pod manifests -> what the scheduler sees, by Kubernetes' own rules for requests and limits."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import DEVICES_KEY
from kubegpu.core.manifests import ManifestError, node_info, pod_request, pod_uid
from kubegpu.core.models import Taint, Toleration
from kubegpu.core.testing import node_manifest, pod_manifest

GPU_NAME = "nvidia.com/gpu"


def _pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **metadata: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "p", **metadata},
        "spec": {"containers": list(containers), "initContainers": list(init)},
    }


def _container(name: str = "main", **resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "resources": resources}


# ------------------------------------------------------------------------------------------------------------
# Pods: limits, requests, init containers
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}, {"nvidia.com/gpu": 2}),
        ({"requests": {"nvidia.com/gpu": "1"}}, {"nvidia.com/gpu": 1}),
        ({"limits": {"cpu": "4"}, "requests": {"cpu": "500m"}}, {"cpu": 500}),
        ({"limits": {"cpu": "1.5", "memory": "2Gi"}}, {"cpu": 1500, "memory": 2 * 2**30}),
        ({"requests": {"cpu": "0.0001"}}, {"cpu": 1}),
        ({"requests": {"memory": "1500m"}}, {"memory": 2}),
        ({"limits": {"gpu.intel.com/memory.max": "8G"}}, {"gpu.intel.com/memory.max": 8 * 10**9}),
        ({}, {}),
    ],
    ids=[
        "extended-from-limits",
        "extended-falls-back-to-requests",
        "cpu-from-requests",
        "cpu-and-memory-fall-back-to-limits",
        "cpu-millis-round-up",
        "memory-rounds-up-to-bytes",
        "extended-with-suffix",
        "nothing-requested",
    ],
)
def test_a_containers_requests_follow_kubernetes_rules(resources: dict[str, Any], expected: dict[str, int]) -> None:
    request, _ = pod_request(_pod(_container(**resources)))

    assert dict(request.containers[0].resources) == expected


@pytest.mark.parametrize(
    ("container", "field"),
    [
        (_container(requests={"cpu": "2"}, limits={"cpu": "1"}), "containers[0].resources.requests.cpu: 2 is above"),
        (
            _container(requests={"memory": "2Gi"}, limits={"memory": "1Gi"}),
            "containers[0].resources.requests.memory: 2147483648 is above its limit 1073741824",
        ),
        ({**_container(), "ports": [{"containerPort": 80, "hostPort": 99999}]}, "containers[0].ports[0].hostPort"),
        ({**_container(), "ports": [{"containerPort": -1}]}, "containers[0].ports[0].containerPort"),
    ],
    ids=["cpu-above-its-limit", "memory-above-its-limit", "host-port-past-65535", "negative-container-port"],
)
def test_a_container_the_api_server_would_refuse_is_refused_naming_the_field(
    container: dict[str, Any], field: str
) -> None:
    """`kubegpu simulate` takes pods no API server has checked: a request above its limit was counted at the request
    (a pod the cluster would never run placed in the report), a host port of 99999 was a port like any other."""
    with pytest.raises(ManifestError) as refused:
        pod_request(_pod(container))
    assert field in str(refused.value)


def test_a_request_equal_to_its_limit_once_rounded_to_the_nano_unit_is_taken() -> None:
    """The API server reads a quantity rounded up to a nano-unit (apimachinery's ParseQuantity) and compares a
    request with its limit so: 1.0000000002 and 1.0000000001 are both 1000000001n, a pod it admits, which the
    manifest check refused ('2 is above its limit')."""
    container = _container(requests={"cpu": "1.0000000002"}, limits={"cpu": "1.0000000001"})
    assert pod_request(_pod(container))[0].cpu_milli == 1001


def test_the_pods_cpu_and_memory_are_the_larger_of_its_containers_and_its_largest_init_container() -> None:
    pod = _pod(
        _container("a", requests={"cpu": "500m", "memory": "1Gi"}),
        _container("b", requests={"cpu": "1", "memory": "1Gi"}),
        init=(
            _container("setup", requests={"cpu": "2", "memory": "512Mi"}),
            _container("warmup", requests={"cpu": "1", "memory": "1Gi"}),
        ),
    )

    request, _ = pod_request(pod)

    assert request.cpu_milli == 2000  # the init container "setup" needs more cpu than a + b together
    assert request.memory == 2 * 2**30  # a + b need more memory than any init container
    assert [c.name for c in request.containers] == ["a", "b"]  # init containers hold no devices


def _sidecar(name: str, **resources: dict[str, Any]) -> dict[str, Any]:
    return {**_container(name, **resources), "restartPolicy": "Always"}


@pytest.mark.parametrize(
    ("containers", "init", "expected_cpu"),
    [
        ([_container("app", requests={"cpu": "3"})], [_sidecar("proxy", requests={"cpu": "2"})], 5000),
        (
            [_container("app", requests={"cpu": "1"})],
            [_sidecar("proxy", requests={"cpu": "2"}), _container("migrate", requests={"cpu": "4"})],
            6000,
        ),
        (
            [_container("app", requests={"cpu": "1"})],
            [_container("migrate", requests={"cpu": "4"}), _sidecar("proxy", requests={"cpu": "2"})],
            4000,
        ),
        (
            [_container("app", requests={"cpu": "1"})],
            [
                _sidecar("log", requests={"cpu": "1"}),
                _container("migrate", requests={"cpu": "2"}),
                _sidecar("proxy", requests={"cpu": "1"}),
            ],
            3000,
        ),
        (
            [_container("app", requests={"cpu": "1"})],
            [{**_container("setup", requests={"cpu": "2"}), "restartPolicy": "OnFailure"}],
            2000,
        ),
    ],
    ids=[
        "sidecar-adds-to-the-app",
        "init-after-a-sidecar-runs-beside-it",
        "init-before-a-sidecar-runs-alone",
        "each-init-counts-the-sidecars-started-before-it",
        "only-restartPolicy-Always-makes-a-sidecar",
    ],
)
def test_sidecar_containers_count_as_kube_scheduler_1_29_counts_them(
    containers: list[dict[str, Any]], init: list[dict[str, Any]], expected_cpu: int
) -> None:
    """resource.PodRequests: sidecars (init containers with restartPolicy Always) run for the pod's life, so their
    requests add to the containers'; each classic init container runs beside the sidecars started before it."""
    request, _ = pod_request(_pod(*containers, init=tuple(init)))

    assert request.cpu_milli == expected_cpu


def test_a_sidecars_devices_are_held_beside_the_apps_and_a_classic_init_containers_are_not() -> None:
    pod = _pod(
        _container("app", limits={"nvidia.com/gpu": "2"}),
        init=(
            _sidecar("monitor", limits={"nvidia.com/gpu": "1"}),
            _container("warmup", limits={"nvidia.com/gpu": "3"}),
        ),
    )

    request, _ = pod_request(pod)

    # The sidecar holds its own device; warmup runs beside monitor (3 + 1 > app + monitor): it holds the one more
    # GPU its step needs beyond what app and monitor hold, as the kubelet gives it that one beside theirs.
    assert [(c.name, dict(c.resources), c.init) for c in request.containers] == [
        ("app", {"nvidia.com/gpu": 2}, False), ("monitor", {"nvidia.com/gpu": 1}, False),
        ("warmup", {"nvidia.com/gpu": 1}, True),
    ]  # fmt: skip
    assert request.total("nvidia.com/gpu") == request.requests["nvidia.com/gpu"] == 4
    assert [(s.name, dict(s.resources), s.sidecars) for s in request.init_steps] == [
        ("warmup", {"nvidia.com/gpu": 3}, ("monitor",))
    ]


@pytest.mark.parametrize(
    ("app", "init", "held"),
    [
        ((1,), (4,), {"check": 3}),
        ((2, 2), (4,), {}),
        ((1,), (2, 4, 3), {"second": 3}),
        ((3,), (1, 2), {}),
        ((0,), (2, 2), {"first": 2}),
    ],
    ids=[
        "init-4-app-1-holds-3-more",
        "apps-hold-what-the-init-asks",
        "the-init-asking-the-most-holds-the-difference",
        "inits-asking-less-hold-nothing",
        "only-inits-ask-the-first-of-the-most-holds-it",
    ],
)
def test_the_devices_a_pod_holds_are_the_count_kubernetes_gives_it(
    app: tuple[int, ...], init: tuple[int, ...], held: dict[str, int]
) -> None:
    """The pod holds what Kubernetes counts for it (the apps' sum or the most an init container asks): the init
    container asking the most holds what the app containers do not (the kubelet gives it those beside theirs)."""
    names = ["check", "second", "third"] if len(init) == 1 else ["first", "second", "third"]
    pod = _pod(
        *(_container(f"app{i}", limits={"nvidia.com/gpu": str(n)}) for i, n in enumerate(app)),
        init=tuple(_container(names[i], limits={"nvidia.com/gpu": str(n)}) for i, n in enumerate(init)),
    )

    request, _ = pod_request(pod)

    assert {c.name: c.resources["nvidia.com/gpu"] for c in request.containers if c.init} == held
    assert request.total("nvidia.com/gpu") == request.requests["nvidia.com/gpu"] == max(sum(app), *init)


def test_pod_overhead_is_added_to_a_pod_with_sidecars() -> None:
    pod = _pod(_container("app", requests={"cpu": "1"}), init=(_sidecar("proxy", requests={"cpu": "500m"}),))
    pod["spec"]["overhead"] = {"cpu": "250m"}

    request, _ = pod_request(pod)

    assert request.cpu_milli == 1750


def test_a_pods_totals_and_requested_resources_span_its_containers() -> None:
    request, _ = pod_request(
        pod_manifest("p", {"a": {"nvidia.com/gpu": 2}, "b": {"nvidia.com/gpu": 1, "cpu": "1"}, "c": {}})
    )

    assert request.total("nvidia.com/gpu") == 3
    assert request.requested_resources() == {"nvidia.com/gpu", "cpu"}
    assert request.key == "default/p"


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (
            pod_manifest("p", {"main": {"nvidia.com/gpu": "-1"}}),
            "Pod.spec.containers[0].resources.limits.nvidia.com/gpu: '-1' is negative",
        ),
        (
            _pod(_container("main"), _container("side", requests={"cpu": "-500m"})),
            "Pod.spec.containers[1].resources.requests.cpu: '-500m' is negative",
        ),
        (
            pod_manifest("p", {"main": {"memory": "16GiB"}}),
            "Pod.spec.containers[0].resources.limits.memory: '16GiB' is not a Kubernetes quantity",
        ),
        (
            _pod(_container(), init=(_container("setup", limits={"cpu": "x"}),)),
            "Pod.spec.initContainers[0].resources.limits.cpu: 'x' is not a Kubernetes quantity",
        ),
        (_pod(), "Pod.spec.containers: List should have at least 1 item"),
        (
            {"kind": "Pod", "metadata": {"name": ""}, "spec": {"containers": [_container()]}},
            "Pod.metadata.name",
        ),
        ({"kind": "Pod", "spec": {"containers": [_container()]}}, "Pod.metadata: Field required"),
        (
            {"kind": "Node", "metadata": {"name": "p"}, "spec": {"containers": [_container()]}},
            "Pod.kind: Input should be 'Pod'",
        ),
    ],
    ids=[
        "negative-limit",
        "negative-request",
        "bad-quantity",
        "bad-init-container",
        "no-containers",
        "empty-name",
        "no-metadata",
        "wrong-kind",
    ],
)
def test_a_pod_kubegpu_cannot_read_is_refused_naming_the_field(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        pod_request(pod)

    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_pod_without_a_uid_gets_a_stable_one_and_a_given_uid_is_kept() -> None:
    first, _ = pod_request(_pod(_container(), namespace="ml"))
    again, _ = pod_request(_pod(_container(), namespace="ml"))
    other, _ = pod_request(_pod(_container(), namespace="dev"))
    given, _ = pod_request(_pod(_container(), uid="abc-123"))

    assert first.uid == again.uid == pod_uid("ml", "p")
    assert other.uid != first.uid
    assert given.uid == "abc-123"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.text(max_size=300))
def test_a_made_uid_is_the_name_based_uuid_it_always_was(namespace: str, name: str) -> None:
    """`pod_uid` spells out uuid5 without building a UUID object: the UIDs of simulator pods (and so their allocation
    annotations) stay those that `uuid.uuid5` gave, for any text."""
    try:
        expected = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kubegpu:pod:{namespace}/{name}"))
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            pod_uid(namespace, name)
        return
    assert pod_uid(namespace, name) == expected


def test_scheduling_fields_of_a_pod_are_read() -> None:
    manifest = pod_manifest(
        "p",
        namespace="ml",
        annotations={"gas-allow-cross-tile": "true"},
        node_selector={"pool": "gpu"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists"}],
        scheduler_name="kubegpu",
    )
    manifest["spec"]["nodeName"] = "node-3"
    manifest["status"] = {"phase": "Running"}

    request, deleted = pod_request(manifest)

    assert request.key == "ml/p"
    assert request.annotations == {"gas-allow-cross-tile": "true"}
    assert request.node_selector == {"pool": "gpu"}
    assert request.tolerations == (
        Toleration(key="gpu", operator="Exists", effect="NoSchedule"),
        Toleration(operator="Exists"),
    )
    assert request.scheduler_name == "kubegpu"
    assert request.node_name == "node-3"
    assert request.phase == "Running"
    assert not deleted


def test_a_pod_being_deleted_is_marked_so() -> None:
    _, deleted = pod_request(pod_manifest("p", deleted=True))

    assert deleted


# ------------------------------------------------------------------------------------------------------------
# Nodes
# ------------------------------------------------------------------------------------------------------------


def test_a_bare_node_gets_kubernetes_defaults() -> None:
    node = node_info({"kind": "Node", "metadata": {"name": "n"}})

    assert node.allocatable == {"pods": 110}
    assert node.ready  # no conditions: hand-written simulator input counts as Ready
    assert not node.unschedulable
    assert node.taints == ()
    assert node.inventories == {}


def test_allocatable_wins_over_capacity_and_capacity_is_used_without_it() -> None:
    with_both = {
        "kind": "Node",
        "metadata": {"name": "n"},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96"}, "allocatable": {"nvidia.com/gpu": "7"}},
    }
    capacity_only = {"kind": "Node", "metadata": {"name": "n"}, "status": {"capacity": {"cpu": "95500m"}}}

    assert node_info(with_both).allocatable == {"nvidia.com/gpu": 7, "pods": 110}
    assert node_info(capacity_only).allocatable == {"cpu": 95500, "pods": 110}


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([{"type": "Ready", "status": "True"}], True),
        ([{"type": "Ready", "status": "False"}], False),
        ([{"type": "Ready", "status": "Unknown"}], False),
        ([{"type": "MemoryPressure", "status": "False"}], True),
    ],
    ids=["ready", "not-ready", "unknown", "no-ready-condition"],
)
def test_a_node_is_ready_unless_its_ready_condition_says_otherwise(
    conditions: list[dict[str, str]], ready: bool
) -> None:
    manifest = node_manifest("n")
    manifest["status"]["conditions"] = conditions

    assert node_info(manifest).ready is ready


def test_taints_cordon_and_labels_of_a_node_are_read() -> None:
    manifest = node_manifest(
        "n", labels={"pool": "gpu"}, taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    )
    manifest["spec"]["unschedulable"] = True

    node = node_info(manifest)

    assert node.labels == {"pool": "gpu"}
    assert node.taints == (Taint("gpu", "yes", "NoSchedule"),)
    assert node.unschedulable


def test_a_nodes_advertised_inventories_are_decoded() -> None:
    devices = {"version": 1, "inventories": {"nvidia": {"plugin": "nvidia", "devices": [{"id": "0"}]}}}

    node = node_info(node_manifest("n", annotations={DEVICES_KEY: json.dumps(devices)}))

    assert [d.id for d in node.inventories["nvidia"].devices] == ["0"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", f"Node gpu-7: metadata.annotations.{DEVICES_KEY}: not valid JSON"),
        (
            json.dumps({"inventories": {"nvidia": {"plugin": "nvidia", "devices": [{"id": ""}]}}}),
            f"Node gpu-7: metadata.annotations.{DEVICES_KEY}.inventories.nvidia.devices[0].id:",
        ),
        (json.dumps({"version": 2}), f"Node gpu-7: metadata.annotations.{DEVICES_KEY}.version:"),
    ],
    ids=["not-json", "empty-device-id", "unsupported-version"],
)
def test_a_malformed_devices_annotation_names_the_node_and_the_field(value: str, message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        node_info(node_manifest("gpu-7", annotations={DEVICES_KEY: value}))

    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"status": {"allocatable": {"nvidia.com/gpu": "-2"}}},
            "Node.status.allocatable.nvidia.com/gpu: '-2' is negative",
        ),
        ({"spec": {"taints": [{"key": "gpu", "effect": "Sometimes"}]}}, "Node.spec.taints[0].effect:"),
        ({"metadata": {}}, "Node.metadata.name: Field required"),
    ],
    ids=["negative-allocatable", "unknown-taint-effect", "no-name"],
)
def test_a_node_kubegpu_cannot_read_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    manifest = {"kind": "Node", "metadata": {"name": "n"}, **change}

    with pytest.raises(ManifestError) as caught:
        node_info(manifest)

    assert str(caught.value).startswith(message)


def _upstream_pod_cpu(containers: list[int], init: list[tuple[int, bool]], overhead: int) -> int:
    """kube-scheduler's aggregateContainerResourcesByFn for one resource, step by step as upstream writes it."""
    result = sum(containers)
    sidecars, steps = 0, 0
    for amount, sidecar in init:
        if sidecar:
            result += amount
            sidecars += amount
            step = sidecars
        else:
            step = amount + sidecars
        steps = max(steps, step)
    return max(result, steps) + overhead


@settings(max_examples=300, deadline=None)
@given(
    containers=st.lists(st.integers(0, 8), min_size=1, max_size=4),
    init=st.lists(st.tuples(st.integers(0, 8), st.booleans()), max_size=6),
    overhead=st.integers(0, 3),
)
def test_pod_requests_match_kube_schedulers_step_by_step_rule(
    containers: list[int], init: list[tuple[int, bool]], overhead: int
) -> None:
    pod = _pod(
        *(_container(f"c{i}", requests={"cpu": str(cpu)}) for i, cpu in enumerate(containers)),
        init=tuple(
            {**_container(f"i{i}", requests={"cpu": str(cpu)}), **({"restartPolicy": "Always"} if sidecar else {})}
            for i, (cpu, sidecar) in enumerate(init)
        ),
    )
    pod["spec"]["overhead"] = {"cpu": str(overhead)}

    request, _ = pod_request(pod)

    assert request.cpu_milli == 1000 * _upstream_pod_cpu(containers, init, overhead)


@pytest.mark.parametrize(
    ("app", "init", "holders"),
    [
        ({"cpu": "1"}, [("check", {GPU_NAME: "1", "cpu": "2"})], [("check", {GPU_NAME: 1})]),
        ({}, [("small", {GPU_NAME: "1"}), ("big", {GPU_NAME: "2"})], [("big", {GPU_NAME: 2})]),
        ({GPU_NAME: "1"}, [("check", {GPU_NAME: "1"})], []),
        ({GPU_NAME: "1"}, [("check", {GPU_NAME: "1", "example.com/fpga": "1"})], [("check", {"example.com/fpga": 1})]),
    ],
    ids=["init-only", "largest-of-two-holds", "app-asks-it-too", "only-what-no-app-asks"],
)  # fmt: skip
def test_a_device_only_init_containers_ask_for_is_held_by_the_one_that_asks_the_most(
    app: dict[str, str], init: list[tuple[str, dict[str, str]]], holders: list[tuple[str, dict[str, int]]]
) -> None:
    """The kubelet allocates an init container's devices and keeps them for its pod; where no app container asks
    the device, the scheduler must name them to the init container (before, none held them: no allocation was
    written). Its cpu and memory stay counted in the pod's requests alone."""
    document = pod_manifest("p", {"main": app})
    document["spec"]["initContainers"] = [{"name": n, "resources": {"limits": r}} for n, r in init]
    pod, _ = pod_request(document)
    assert [(c.name, dict(c.resources)) for c in pod.containers if c.init] == holders
    assert [c.name for c in pod.containers if not c.init] == ["main"]


CORES_NAME = "nvidia.com/gpucores"
SHARE_QUALIFIERS = {CORES_NAME: GPU_NAME, "nvidia.com/gpumem": GPU_NAME}


@pytest.mark.parametrize(
    ("app", "init", "holders"),
    [
        ({GPU_NAME: "1"}, {GPU_NAME: "1", CORES_NAME: "30"}, []),
        ({GPU_NAME: "1"}, {GPU_NAME: "1", "example.com/fpga": "1"}, [("check", {"example.com/fpga": 1})]),
        ({GPU_NAME: "1"}, {GPU_NAME: "3", CORES_NAME: "30"}, [("check", {GPU_NAME: 2, CORES_NAME: 30})]),
        ({}, {GPU_NAME: "1", CORES_NAME: "30"}, [("check", {GPU_NAME: 1, CORES_NAME: 30})]),
    ],
    ids=["share-of-the-apps-gpu-holds-nothing", "a-device-no-app-asks-is-held", "more-gpus-hold-their-share",
         "init-only-share-is-held-whole"],
)  # fmt: skip
def test_a_qualifier_is_held_only_beside_its_device(
    app: dict[str, str], init: dict[str, str], holders: list[tuple[str, dict[str, int]]]
) -> None:
    """A plugin declares `nvidia.com/gpucores` an amount of each `nvidia.com/gpu` (a qualifier): an init container
    asking 30 % of a GPU beside an app asking the whole GPU holds no compute of its own (before, the holder asked
    `gpucores` without a GPU, and the pod was refused for it); a device only the init container asks (an FPGA) is
    still held by it; where it asks more GPUs than the app, it holds them with its share of each."""
    document = pod_manifest("p", {"main": app})
    document["spec"]["initContainers"] = [{"name": "check", "resources": {"limits": init}}]
    pod, _ = pod_request(document, SHARE_QUALIFIERS)
    assert [(c.name, dict(c.resources)) for c in pod.containers if c.init] == holders
    assert pod.requests == {**{r: int(n) for r, n in app.items()}, **{r: int(n) for r, n in init.items()}} | {
        GPU_NAME: max(int(app.get(GPU_NAME, 0)), int(init[GPU_NAME]))
    }  # Kubernetes' count, unchanged


def test_an_init_container_asking_more_memory_of_a_gpu_share_holds_nothing_alone() -> None:
    """A GPU share's memory is no device without its GPU: an init container asking the app's one GPU with more
    memory (8000 MiB against 4096) holds no memory of its own (a container asking memory without a GPU is refused),
    and is given the app's share; one asking more GPUs, none of them shares, holds the GPUs the app does not."""
    share = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}
    pod = _pod(
        _container("app", limits=share), init=(_container("check", limits={**share, "nvidia.com/gpumem": "8000"}),)
    )
    request, _ = pod_request(pod)
    assert [c.name for c in request.containers] == ["app"]
    assert request.requests["nvidia.com/gpumem"] == 8000  # Kubernetes' count still

    pod = _pod(
        _container("app", limits={"nvidia.com/gpu": "1"}), init=(_container("check", limits={"nvidia.com/gpu": "4"}),)
    )
    request, _ = pod_request(pod)
    assert [(c.name, dict(c.resources)) for c in request.containers] == [
        ("app", {"nvidia.com/gpu": 1}), ("check", {"nvidia.com/gpu": 3})
    ]  # fmt: skip


# Microsoft KubeGPU's pod annotation (kubegpu.core.legacy_kubegpu): DLWorkspace wrote it in single quotes.
def _kubegpu_info(containers: dict[str, Any]) -> str:
    return "'" + json.dumps({"podname": "job", "runningcontainer": containers}) + "'"


_GIVEN = {
    "requests": {"alpha.gpu/numgpu": 2},
    "allocatefrom": {
        (where := f"alpha/grpresource/gpugrp1/0/gpugrp0/0/gpu/GPU-{i}/{part}"): where
        for i in (0, 1)
        for part in ("cards", "memory")
    },
}


def test_a_pod_kubegpu_bound_before_the_switch_holds_the_gpus_its_annotation_names() -> None:
    document = pod_manifest(
        "job", {"main": {}, "side": {}}, annotations={"pod.alpha/DeviceInformation": _kubegpu_info({"main": _GIVEN})}
    )
    document["spec"]["nodeName"] = "n1"
    request, _ = pod_request(document)
    assert {c.name: dict(c.resources) for c in request.containers} == {"main": {"nvidia.com/gpu": 2}, "side": {}}
    assert request.requests["nvidia.com/gpu"] == 2


def test_a_pending_pod_asking_gpus_through_kubegpus_annotation_is_refused_saying_what_to_write() -> None:
    document = pod_manifest(
        "job",
        annotations={"pod.alpha/DeviceInformation": _kubegpu_info({"main": {"requests": {"alpha.gpu/numgpu": 2}}})},
    )
    with pytest.raises(ManifestError) as refused:
        pod_request(document)
    assert "asks 2 GPU(s) for container main" in str(refused.value)
    assert "set resources.limits nvidia.com/gpu: 2" in str(refused.value)
    # A pod that also lists the GPUs the kubegpu way is read the kubegpu way.
    document["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    assert dict(pod_request(document)[0].containers[0].resources) == {"nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    "value",
    ["not json", "'{}'", json.dumps({"runningcontainer": [1]}),
     json.dumps({"runningcontainer": {"main": {"requests": {"alpha.gpu/numgpu": "x"}}}}),
     json.dumps({"runningcontainer": {"main": {"allocatefrom": {"a/gpu/0/cards": 5}}}}),
     "'" + " " * 70000 + "'", "\x1b[2J\u202e"],
)  # fmt: skip
def test_a_kubegpu_annotation_kubegpu_cannot_read_is_ignored_and_never_makes_a_bound_pod_unreadable(value: str) -> None:
    document = pod_manifest("job", {"main": {"nvidia.com/gpu": 0}}, annotations={"pod.alpha/DeviceInformation": value})
    document["spec"]["nodeName"] = "n1"
    assert pod_request(document)[0].requests.get("nvidia.com/gpu", 0) == 0
    del document["spec"]["nodeName"]
    pod_request(document)  # pending: not refused either


def test_kubegpus_annotation_neither_adds_to_kubegpus_allocation_nor_counts_beyond_its_bound() -> None:
    annotations = {"pod.alpha/DeviceInformation": _kubegpu_info({"main": _GIVEN}), "kubegpu.io/allocation": "{}"}
    document = pod_manifest("job", annotations=annotations)
    document["spec"]["nodeName"] = "n1"
    assert pod_request(document)[0].requests.get("nvidia.com/gpu", 0) == 0
    many = {"allocatefrom": {f"g/gpu/{i}/cards": "x" for i in range(2000)}}
    document = pod_manifest("job", annotations={"pod.alpha/DeviceInformation": _kubegpu_info({"main": many})})
    document["spec"]["nodeName"] = "n1"
    assert pod_request(document)[0].requests["nvidia.com/gpu"] == 1024


def _with_init(document: dict[str, Any], name: str, *, sidecar: bool = False) -> dict[str, Any]:
    init: dict[str, Any] = {"name": name, "image": "busybox", "resources": {}}
    if sidecar:
        init["restartPolicy"] = "Always"
    document["spec"]["initContainers"] = [init]
    return document


@pytest.mark.parametrize(
    ("key", "sidecar"), [("initcontainer", False), ("runningcontainer", True)], ids=["init-container", "sidecar"]
)
def test_a_pending_pod_asking_gpus_for_an_init_container_through_kubegpus_annotation_is_refused(
    key: str, sidecar: bool
) -> None:
    """KubeGPU's annotation gives init containers GPUs under `initcontainer` (its PodInfo's InitContainers): such a
    pod, placed without them, ran its init container without a GPU. A sidecar (an init container that keeps
    running) named under `runningcontainer` is asked for just as a container is."""
    info = "'" + json.dumps({key: {"prep": {"requests": {"alpha.gpu/numgpu": 2}}}}) + "'"
    pod = pod_manifest("job", annotations={"pod.alpha/DeviceInformation": info})
    document = _with_init(pod, "prep", sidecar=sidecar)
    with pytest.raises(ManifestError) as refused:
        pod_request(document)
    assert "asks 2 GPU(s) for container prep" in str(refused.value)


def test_a_pod_kubegpu_bound_holds_what_its_annotation_gave_its_init_container_and_sidecar() -> None:
    info = {"initcontainer": {"prep": _GIVEN}, "runningcontainer": {"main": {"allocatefrom": {"g/gpu/0/cards": "x"}}}}
    document = _with_init(
        pod_manifest("job", annotations={"pod.alpha/DeviceInformation": "'" + json.dumps(info) + "'"}), "prep"
    )
    document["spec"]["nodeName"] = "n1"
    assert pod_request(document)[0].requests["nvidia.com/gpu"] == 2  # the init container's 2 before main's 1
    info = {"runningcontainer": {"log": _GIVEN, "main": {"allocatefrom": {"g/gpu/0/cards": "x"}}}}
    document = _with_init(
        pod_manifest("job", annotations={"pod.alpha/DeviceInformation": "'" + json.dumps(info) + "'"}),
        "log",
        sidecar=True,
    )
    document["spec"]["nodeName"] = "n1"
    assert pod_request(document)[0].requests["nvidia.com/gpu"] == 3  # a sidecar runs beside main: 2 + 1
