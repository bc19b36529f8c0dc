"""The `kubegpu.io/allocation` and `kubegpu.io/devices` annotations: what the scheduler and node side share.

A user meets this codec when a pod's annotation is hand-edited, truncated or written by a newer kubegpu: the
error must be one line that names the field, and a tampered allocation must never verify.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    DEVICES_KEY,
    AllocationRecord,
    AnnotationError,
    decode_allocation,
    decode_devices,
    encode_allocation,
    encode_devices,
    init_devices,
    merge_allocations,
    sign_allocation,
    verify_allocation,
)
from kubegpu.core.errors import InputError
from kubegpu.core.models import DeviceInfo, DeviceInventory, InitStep, NodeDevices, PluginAllocation

KEY = b"cluster-signing-key"


def _record(**overrides: Any) -> AllocationRecord:
    document: dict[str, Any] = {
        "version": 1,
        "node": "trn-0",
        "podUID": "uid-1",
        "containers": {"main": {"aws.amazon.com/neurondevice": ["4", "5", "6", "7"]}},
    }
    document.update(overrides)
    return AllocationRecord.model_validate(document)


_DROP = object()  # a field to leave out of the document


def _valid(**changes: Any) -> str:
    document: dict[str, Any] = {
        "version": 1,
        "node": "n",
        "podUID": "u",
        "containers": {"main": {"nvidia.com/gpu": ["0"]}},
    }
    document.update(changes)
    return json.dumps({k: v for k, v in document.items() if v is not _DROP})


# ------------------------------------------------------------------------------------------------------------
# Round trip
# ------------------------------------------------------------------------------------------------------------


def test_merged_plugin_allocations_round_trip_through_the_annotation() -> None:
    parts = [
        PluginAllocation(plugin="nvidia", containers={"main": {"nvidia.com/gpu": ["0", "1"]}}),
        PluginAllocation(
            plugin="intel-gas",
            containers={"side": {"gpu.intel.com/i915": ["card0"]}},
            shares={"side": {"gpu.intel.com/memory.max": {"card0": 5_000_000_000}}},
            fields={"tiles": {"card0": ["gt0"]}},
        ),
    ]
    record = merge_allocations("node-a", "uid-9", parts)

    decoded = decode_allocation(encode_allocation(record))

    assert decoded == record
    assert decoded.device_ids("main", "nvidia.com/gpu") == ["0", "1"]
    assert decoded.device_ids("side", "gpu.intel.com/i915") == ["card0"]
    assert decoded.shares["side"]["gpu.intel.com/memory.max"] == {"card0": 5_000_000_000}
    assert decoded.plugins == {"intel-gas": {"tiles": {"card0": ["gt0"]}}}


def test_encoding_is_compact_and_leaves_out_empty_optional_sections() -> None:
    text = encode_allocation(_record())

    assert "\n" not in text
    assert set(json.loads(text)) == {"version", "node", "podUID", "containers"}


def test_unknown_top_level_fields_from_a_newer_writer_survive_a_round_trip() -> None:
    record = decode_allocation(_valid(priorityClass="gold"))

    assert json.loads(encode_allocation(record))["priorityClass"] == "gold"


def test_a_device_id_the_pod_did_not_get_reads_as_empty() -> None:
    record = _record()

    assert record.device_ids("main", "nvidia.com/gpu") == []
    assert record.device_ids("sidecar", "aws.amazon.com/neurondevice") == []


# ------------------------------------------------------------------------------------------------------------
# Signature
# ------------------------------------------------------------------------------------------------------------


def test_a_signed_allocation_verifies_after_an_encode_decode_round_trip() -> None:
    signed = sign_allocation(_record(), KEY)

    decoded = decode_allocation(encode_allocation(signed))

    assert decoded.signature == signed.signature
    assert verify_allocation(decoded, KEY)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"containers": {"main": {"aws.amazon.com/neurondevice": ["0", "1", "2", "3"]}}}, KEY),
        ({"containers": {"main": {"aws.amazon.com/neurondevice": ["4", "5", "6", "7", "8"]}}}, KEY),
        ({"node": "trn-1"}, KEY),
        ({"podUID": "uid-2"}, KEY),
        ({"plugins": {"neuron": {"ring": [4, 5]}}}, KEY),
        ({"init": {"check": {"aws.amazon.com/neurondevice": ["4"]}}}, KEY),
        ({}, b"another-key"),
    ],
    ids=["other-devices", "extra-device", "other-node", "other-pod", "added-plugin-field", "added-init", "wrong-key"],
)
def test_a_tampered_allocation_or_a_wrong_key_fails_verification(change: dict[str, Any], key: bytes) -> None:
    signed = sign_allocation(_record(), KEY)
    tampered = signed.model_copy(update=change)

    assert not verify_allocation(tampered, key)


def test_what_init_containers_are_given_is_signed_and_only_ever_the_pods_own_devices() -> None:
    """`init` names what each classic init container is given: signed like every field (removing it breaks the
    signature), left out while empty (an allocation signed before the field existed still verifies), and only ever
    ids its pod's `containers` name: one naming another device is refused, naming the field."""
    gpu = "nvidia.com/gpu"
    record = _record(containers={"main": {gpu: ["0"]}, "check": {gpu: ["1"]}}, init={"check": {gpu: ["1", "0"]}})
    signed = sign_allocation(record, KEY)
    assert verify_allocation(decode_allocation(encode_allocation(signed)), KEY)
    assert decode_allocation(encode_allocation(signed)).given("check") == {gpu: ["1", "0"]}
    assert not verify_allocation(signed.model_copy(update={"init": {}}), KEY)
    old = sign_allocation(_record(), KEY)  # signed without the field
    assert "init" not in encode_allocation(old) and verify_allocation(decode_allocation(encode_allocation(old)), KEY)

    with pytest.raises(AnnotationError) as refused:
        decode_allocation(_valid(init={"check": {gpu: ["0", "7"]}}))
    assert str(refused.value) == (
        f"{ALLOCATION_KEY}: init.check.nvidia.com/gpu: 7: an init container is given only devices its pod holds, "
        "and `containers` names no such device"
    )


def test_an_unsigned_allocation_never_verifies() -> None:
    assert not verify_allocation(_record(), KEY)
    assert not verify_allocation(_record(signature=""), KEY)


# ------------------------------------------------------------------------------------------------------------
# Malformed values: one line naming the field
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            _valid(containers={"main": {"nvidia.com/gpu": [3]}}),
            f"{ALLOCATION_KEY}.containers.main.nvidia.com/gpu[0]: Input should be a valid string",
        ),
        (
            _valid(containers={"main": {"nvidia.com/gpu": "0"}}),
            f"{ALLOCATION_KEY}.containers.main.nvidia.com/gpu: Input should be a valid list",
        ),
        (
            _valid(containers={"main": {"nvidia.com/gpu": [3, None]}}),
            f"{ALLOCATION_KEY}.containers.main.nvidia.com/gpu[0]: Input should be a valid string (and 1 more problem)",
        ),
        (_valid(node=""), f"{ALLOCATION_KEY}.node: String should have at least 1 character"),
        (_valid(node=_DROP), f"{ALLOCATION_KEY}.node: Field required"),
        (_valid(podUID=_DROP), f"{ALLOCATION_KEY}.podUID: Field required"),
        (_valid(containers=_DROP), f"{ALLOCATION_KEY}.containers: Field required"),
        (
            _valid(shares={"main": {"gpu.intel.com/memory.max": {"card0": "lots"}}}),
            f"{ALLOCATION_KEY}.shares.main.gpu.intel.com/memory.max.card0: Input should be a valid integer",
        ),
        (_valid(version=_DROP), f"{ALLOCATION_KEY}: version: missing (this kubegpu reads version 1)"),
        (_valid(version=2), f"{ALLOCATION_KEY}: version: unsupported value 2 (this kubegpu reads version 1)"),
        (_valid(version="1"), f"{ALLOCATION_KEY}: version: unsupported value '1'"),
        ('{"version": 1, "node": ', f"{ALLOCATION_KEY}: not valid JSON"),
        ("", f"{ALLOCATION_KEY}: not valid JSON"),
        ("[1, 2]", f"{ALLOCATION_KEY}: expected a JSON object, got list"),
        (None, f"{ALLOCATION_KEY}: the annotation value must be a string holding JSON"),
        (7, f"{ALLOCATION_KEY}: the annotation value must be a string holding JSON"),
    ],
    ids=[
        "device-id-not-a-string",
        "device-ids-not-a-list",
        "two-problems-counted",
        "empty-node",
        "no-node",
        "no-pod-uid",
        "no-containers",
        "share-not-an-integer",
        "no-version",
        "newer-version",
        "version-as-string",
        "truncated-json",
        "empty-value",
        "json-list",
        "not-a-string",
        "a-number",
    ],
)
def test_a_malformed_allocation_gives_one_line_naming_the_field(value: object, message: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_allocation(value)

    text = str(caught.value)
    assert text.startswith(message)
    assert "\n" not in text
    assert isinstance(caught.value, InputError)
    assert caught.value.__cause__ is None  # the caller logs one line, not a chained pydantic error


# ------------------------------------------------------------------------------------------------------------
# The node's `kubegpu.io/devices` annotation
# ------------------------------------------------------------------------------------------------------------


def test_advertised_inventories_round_trip_through_the_node_annotation() -> None:
    devices = NodeDevices(
        inventories={
            "nvidia": DeviceInventory(
                plugin="nvidia",
                devices=[
                    DeviceInfo(id="0", model="H100", memory=80 << 30),
                    DeviceInfo(id="1", healthy=False),
                ],
                topology={"nvlink": [[0, 1]]},
            )
        }
    )

    decoded = decode_devices(encode_devices(devices))

    assert decoded == devices
    assert decoded.inventories["nvidia"].healthy_ids() == ["0"]


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        (
            {"plugin": "nvidia", "devices": [{"id": "0"}, {"id": "0"}]},
            f"{DEVICES_KEY}.inventories.nvidia.devices: device id '0' appears twice",
        ),
        (
            {"plugin": "nvidia", "devices": [{"id": ""}]},
            f"{DEVICES_KEY}.inventories.nvidia.devices[0].id: String should have at least 1 character",
        ),
        (
            {"plugin": "nvidia", "devices": [{"id": "0", "memory": -1}]},
            f"{DEVICES_KEY}.inventories.nvidia.devices[0].memory: Input should be greater than or equal to 0",
        ),
        (
            {"plugin": "nvidia", "devices": [{"id": "0", "colour": "green"}]},
            f"{DEVICES_KEY}.inventories.nvidia.devices[0].colour: Extra inputs are not permitted",
        ),
    ],
    ids=["duplicate-id", "empty-id", "negative-memory", "unknown-field"],
)
def test_a_malformed_devices_annotation_names_the_field(inventory: dict[str, Any], message: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_devices(json.dumps({"version": 1, "inventories": {"nvidia": inventory}}))

    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("containers", "steps", "given"),
    [
        ({"app": ["0"], "check": ["1", "2", "3"]}, [("check", 4, ())], {"check": ["0", "1", "2", "3"]}),
        ({"big": ["0", "1"]}, [("small", 1, ()), ("big", 2, ())], {"small": ["0"], "big": ["0", "1"]}),
        ({"big": ["0", "1"]}, [("big", 2, ()), ("small", 1, ())], {"big": ["0", "1"], "small": ["0"]}),
        (
            {"app": ["0", "1"], "monitor": ["2"], "warmup": ["3"]},
            [("warmup", 3, ("monitor",))],
            {"warmup": ["0", "1", "3"]},
        ),
        ({"app": ["0"]}, [("check", 2, ())], {}),
    ],
    ids=[
        "init-4-app-1",
        "the-second-reuses-the-first-and-takes-more",
        "a-smaller-one-reuses",
        "never-a-running-sidecars",
        "too-few-names-nothing",
    ],
)
def test_each_init_container_is_given_its_pods_devices_as_the_kubelet_gives_them(
    containers: dict[str, list[str]], steps: list[tuple[str, int, tuple[str, ...]]], given: dict[str, list[str]]
) -> None:
    gpu = "nvidia.com/gpu"
    named, lent = init_devices(
        {c: {gpu: ids} for c, ids in containers.items()},
        {},
        tuple(InitStep(name, {gpu: count}, sidecars) for name, count, sidecars in steps),
    )
    assert {c: resources[gpu] for c, resources in named.items()} == given and lent == {}


def test_an_init_container_asking_a_gpu_share_is_given_the_share_of_the_container_holding_as_many() -> None:
    """A GPU share (`nvidia.com/gpu: 1` with compute and memory amounts) is given with its limits: the app's share of
    the same count, every amount of it, so the init container never runs on the whole GPU unlimited."""
    gpu, cores, mem = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem"
    containers = {"main": {gpu: ["3"], cores: ["3"], mem: ["3"]}}
    shares = {"main": {gpu: {"3": 1}, cores: {"3": 30}, mem: {"3": 4096}}}
    named, lent = init_devices(containers, shares, (InitStep("check", {gpu: 1, cores: 30, mem: 4096}),))
    assert named == {"check": {gpu: ["3"], cores: ["3"], mem: ["3"]}}
    assert lent == {"check": shares["main"]}


def test_an_init_container_asking_a_share_of_its_pods_whole_gpu_is_lent_its_amounts_of_it() -> None:
    """A qualifier (`nvidia.com/gpucores` of `nvidia.com/gpu`, as the nvidia plugin declares it) is no device: an
    init container asking 30 % of a GPU in a pod holding one whole GPU is given that GPU and lent its 30 % of it (the
    node side holds it to that); without the declaration it is given the whole GPU alone. Every id `init` names is
    one `containers` names, so the record still decodes."""
    gpu, cores = "nvidia.com/gpu", "nvidia.com/gpucores"
    containers = {"main": {gpu: ["1"]}}
    step = (InitStep("check", {gpu: 1, cores: 30}),)

    named, lent = init_devices(containers, {}, step, {cores: gpu})
    assert (named, lent) == ({"check": {gpu: ["1"]}}, {"check": {cores: {"1": 30}}})

    named, lent = init_devices(containers, {}, step)
    assert (named, lent) == ({"check": {gpu: ["1"]}}, {})

    record = merge_allocations("n", "u", [PluginAllocation(plugin="nvidia", containers=containers)], init=step,
                               qualifiers={cores: gpu})  # fmt: skip
    assert decode_allocation(encode_allocation(record)) == record
