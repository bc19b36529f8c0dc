"""The inputs of the trust-boundary review (issue 10), each refused by its decoder with its own error and a message
naming the field, promptly.

A tenant who may create a pod in one namespace writes its annotations, its container names and its quantities.
Before these checks, a poison allocation annotation escaped the codec as `TypeError`, `RecursionError` or
`ValueError` (taking down the scheduler for every pod), `nvidia.com/gpu: 1e600000` cost minutes of CPU in later
sums, `0.5` GPUs was rounded up to one, and two containers of one name lost a device between them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    DEVICES_KEY,
    MAX_ANNOTATION_BYTES,
    AllocationRecord,
    AnnotationError,
    decode_allocation,
    decode_devices,
    sign_allocation,
    verify_allocation,
)
from kubegpu.core.errors import InputError
from kubegpu.core.manifests import ManifestError, node_info, pod_request
from kubegpu.core.quantity import MAX_QUANTITY, QuantityError, parse_quantity, to_int
from kubegpu.core.testing import pod_manifest

KEY = b"0123456789abcdef0123456789abcdef"
HEAD = '{"version":1,"node":"n","podUID":"u","containers":{"main":{"nvidia.com/gpu":["0"]}}'


@contextmanager
def promptly(seconds: float = 0.5) -> Iterator[None]:
    started = time.thread_time()  # CPU of this thread: other processes on the machine's cores do not count
    yield
    assert time.thread_time() - started < seconds


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and len(text) < 600
    assert isinstance(error, InputError)
    return text


# ------------------------------------------------------------------------------------------------------------
# Finding 1: a poison allocation annotation is an AnnotationError, never another exception
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (HEAD + ',"plugins":{"p":' + "[" * 3000 + "]" * 3000 + "}}", f"{ALLOCATION_KEY}: nested more than 32 levels"),
        (HEAD + ',"plugins":{"p":{"a":' + "[" * 30 + "]" * 30 + "}}}", f"{ALLOCATION_KEY}: nested more than 32 levels"),
        ("{" + '"a":{' * 3000 + "}" * 3001, f"{ALLOCATION_KEY}: nested more than 32 levels"),
        (HEAD + ',"issued":' + "1" * 5000 + "}", f"{ALLOCATION_KEY}: not valid JSON"),
        (HEAD + ',"shares":{"main":{"r":{"c":-' + "9" * 5000 + "}}}}", f"{ALLOCATION_KEY}: not valid JSON"),
        (
            HEAD + ',"node2":"' + "x" * MAX_ANNOTATION_BYTES + '"}',
            f"{ALLOCATION_KEY}: 262239 characters is more than the {MAX_ANNOTATION_BYTES} bytes allowed",
        ),
        (
            HEAD + ',"n":"' + "é" * (MAX_ANNOTATION_BYTES // 2) + '"}',
            f"{ALLOCATION_KEY}: 262235 bytes is more than the {MAX_ANNOTATION_BYTES} allowed",
        ),
        ('{"version":1,"node":"\ud800"}', f"{ALLOCATION_KEY}: not valid JSON (a lone surrogate"),
        (HEAD + ',"issued":NaN}', f"{ALLOCATION_KEY}: not valid JSON"),
        (HEAD + ',"issued":1e400}', f"{ALLOCATION_KEY}: not valid JSON"),
        ('{"version":"' + "v" * 10_000 + '"}', f"{ALLOCATION_KEY}: version: unsupported value 'vvvv"),
    ],
    ids=[
        "3000-deep-json",
        "33-levels",
        "3000-deep-objects",
        "5000-digit-integer",
        "5000-digit-negative",
        "over-256-KiB",
        "over-256-KiB-in-utf-8",
        "lone-surrogate",
        "nan",
        "infinite-number",
        "huge-version",
    ],
)
def test_a_poison_allocation_is_an_annotation_error_naming_the_problem(value: str, message: str) -> None:
    with promptly(), pytest.raises(AnnotationError) as caught:
        decode_allocation(value)

    assert _one_line(caught.value).startswith(message)


def test_nesting_within_the_bound_still_decodes() -> None:
    record = decode_allocation(HEAD + ',"plugins":{"p":{"a":' + "[" * 29 + "]" * 29 + "}}}")

    assert verify_allocation(sign_allocation(record, KEY), KEY)


@pytest.mark.parametrize(
    "signature",
    ["é" * 64, "\u0660" * 64, "g" * 64, "0" * 63, "0" * 65, " " + "0" * 63, "0" * 64 + "\n", "", None],
    ids=["non-ascii", "arabic-digits", "not-hex", "63-digits", "65-digits", "space", "newline", "empty", "none"],
)
def test_a_malformed_signature_simply_does_not_verify(signature: str | None) -> None:
    record = decode_allocation(json.dumps({**json.loads(HEAD + "}"), "signature": signature}))

    with promptly():
        assert verify_allocation(record, KEY) is False


def test_the_right_signature_in_capitals_does_not_verify() -> None:
    signed = sign_allocation(decode_allocation(HEAD + "}"), KEY)
    assert signed.signature is not None

    assert verify_allocation(signed, KEY)
    assert not verify_allocation(signed.model_copy(update={"signature": signed.signature.upper()}), KEY)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"inventories":' + "[" * 3000 + "]" * 3000 + "}", f"{DEVICES_KEY}: nested more than 32 levels"),
        ('{"inventories":{"n":{"plugin":"n","devices":[{"id":"0","memory":' + "1" * 5000 + "}]}}}", DEVICES_KEY),
        (
            '{"inventories":{},"x":"' + "x" * MAX_ANNOTATION_BYTES + '"}',
            f"{DEVICES_KEY}: 262169 characters is more than",
        ),
    ],
    ids=["3000-deep-json", "5000-digit-integer", "over-256-KiB"],
)
def test_a_poison_devices_annotation_is_an_annotation_error(value: str, message: str) -> None:
    with promptly(), pytest.raises(AnnotationError) as caught:
        decode_devices(value)

    assert _one_line(caught.value).startswith(message)


def test_a_field_name_holding_a_newline_or_a_megabyte_stays_one_short_line() -> None:
    containers = {"a\nlevel=error msg=forged" + "x" * 100_000: {"nvidia.com/gpu": "0"}}

    with pytest.raises(AnnotationError) as caught:
        decode_allocation(json.dumps({**json.loads(HEAD + "}"), "containers": containers}))

    assert "\\n" in _one_line(caught.value) and len(str(caught.value)) < 300


def test_a_record_signed_before_is_still_checked_only_by_its_mac() -> None:
    record = AllocationRecord.model_validate({**json.loads(HEAD + "}"), "signature": "0" * 64})

    assert not verify_allocation(record, KEY)


# ------------------------------------------------------------------------------------------------------------
# Finding 4: quantities are bounded before any big-number arithmetic; devices are whole numbers
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e600000", "'1e600000' is too large"),
        ("1e999999999999", "'1e999999999999' is too large"),
        ("8Ei", "'8Ei' is too large"),
        ("9223372036854775808", "'9223372036854775808' is too large"),
        (2**63, "a 64-bit integer is too large"),
        (10**5000, "a 16610-bit integer is too large"),
        (1e300, "1e+300 is too large"),
        ("9" * 65, "'9999999999999999…9999999' is 65 characters long; a quantity has at most 64"),
        ("1_000", "'1_000' is not a Kubernetes quantity"),
        ("\u0661\u0662", "'١٢' is not a Kubernetes quantity"),
        ("0x10", "'0x10' is not a Kubernetes quantity"),
        ("NaN", "'NaN' is not a finite quantity"),
    ],
    ids=[
        "1e600000",
        "beyond-decimal-range",
        "8-exbibytes",
        "2-to-the-63",
        "int-2-to-the-63",
        "5000-digit-int",
        "huge-float",
        "65-characters",
        "underscore",
        "arabic-digits",
        "hex",
        "nan",
    ],
)
def test_an_absurd_quantity_is_refused_before_any_arithmetic(value: object, message: str) -> None:
    with promptly(0.1), pytest.raises(QuantityError) as caught:
        parse_quantity(value)

    assert _one_line(caught.value).startswith(message)


def test_the_largest_quantity_and_a_tiny_one_are_read() -> None:
    assert to_int("9223372036854775807") == MAX_QUANTITY
    assert to_int("7Ei") == 7 * 2**60
    with promptly(0.1):
        assert to_int("1e-600000") == 1  # below a nano-unit: one nano-unit, as Kubernetes rounds, then up to 1


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (
            pod_manifest("p", {"main": {"nvidia.com/gpu": "1e600000"}}),
            "Pod.spec.containers[0].resources.limits.nvidia.com/gpu: '1e600000' is too large",
        ),
        (
            pod_manifest("p", {"main": {"nvidia.com/gpu": "0.5"}}),
            "Pod.spec.containers[0].resources.limits.nvidia.com/gpu: 0.5 is not a whole number",
        ),
        (
            pod_manifest("p", {"main": {}, "side": {"nvidia.com/gpu": "100m"}}),
            "Pod.spec.containers[1].resources.limits.nvidia.com/gpu: 0.1 is not a whole number",
        ),
        (
            {
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {
                    "containers": [{"name": "main"}],
                    "initContainers": [{"name": "init", "resources": {"requests": {"aws.amazon.com/neuron": 1.5}}}],
                },
            },
            "Pod.spec.initContainers[0].resources.requests.aws.amazon.com/neuron: 1.5 is not a whole number",
        ),
        (
            pod_manifest("p", {"main": {"memory": "1e600000"}}),
            "Pod.spec.containers[0].resources.limits.memory: '1e600000' is too large",
        ),
    ],
    ids=["huge-device-count", "half-a-gpu", "100-milli-gpus", "fractional-init-container", "huge-memory"],
)
def test_a_pod_asking_for_absurd_or_fractional_devices_is_refused_naming_the_field(
    pod: dict[str, Any], message: str
) -> None:
    with promptly(0.1), pytest.raises(ManifestError) as caught:
        pod_request(pod)

    assert _one_line(caught.value).startswith(message)
    assert "whole number" not in message or "extended resource" in str(caught.value)


def test_fractions_of_native_resources_are_still_rounded_up_as_kubernetes_does() -> None:
    request, _ = pod_request(pod_manifest("p", {"main": {"cpu": "0.0001", "memory": "1500m", "nvidia.com/gpu": "2"}}))

    assert dict(request.containers[0].resources) == {"cpu": 1, "memory": 2, "nvidia.com/gpu": 2}


@pytest.mark.parametrize(
    ("allocatable", "message"),
    [
        ({"nvidia.com/gpu": "1.5"}, "Node.status.allocatable.nvidia.com/gpu: 1.5 is not a whole number"),
        ({"nvidia.com/gpu": "1e600000"}, "Node.status.allocatable.nvidia.com/gpu: '1e600000' is too large"),
        ({"cpu": "1e600000"}, "Node.status.allocatable.cpu: '1e600000' is too large"),
    ],
    ids=["fractional-devices", "huge-devices", "huge-cpu"],
)
def test_a_node_with_absurd_or_fractional_allocatable_is_refused_naming_the_field(
    allocatable: dict[str, str], message: str
) -> None:
    node = {"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": allocatable}}

    with promptly(0.1), pytest.raises(ManifestError) as caught:
        node_info(node)

    assert _one_line(caught.value).startswith(message)


# ------------------------------------------------------------------------------------------------------------
# Finding 6 (in every front-end): two containers of one name
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("containers", "init", "message"),
    [
        (["main", "main"], [], "Pod.spec.containers[1].name: 'main' is also the name of spec.containers[0]"),
        (["main"], ["main"], "Pod.spec.initContainers[0].name: 'main' is also the name of spec.containers[0]"),
        (["main"], ["setup", "setup"], "Pod.spec.initContainers[1].name: 'setup' is also the name of"),
    ],
    ids=["two-containers", "init-and-container", "two-init-containers"],
)
def test_two_containers_of_one_name_are_refused(containers: list[str], init: list[str], message: str) -> None:
    limits = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": name, **limits} for name in containers],
            "initContainers": [{"name": name} for name in init],
        },
    }

    with pytest.raises(ManifestError) as caught:
        pod_request(pod)

    assert _one_line(caught.value).startswith(message)
    assert "must be unique" in str(caught.value)
