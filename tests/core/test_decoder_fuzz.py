"""Every decoder of outside input, fuzzed: whatever a tenant, a caller or a file holds, the answer is the decoder's
own error type (an `InputError`) or a value, never another exception, and it comes in bounded time.

A tenant writes a pod's annotations and quantities; a node writes its devices annotation; anyone hands `kubegpu
simulate` a file. An exception other than the documented one escapes the loop that called the decoder and, in the
scheduler and the extender, takes the process down for every other pod.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import (
    AllocationRecord,
    AnnotationError,
    decode_allocation,
    decode_devices,
    sign_allocation,
    verify_allocation,
)
from kubegpu.core.errors import InputError
from kubegpu.core.manifests import ManifestError, node_info, pod_request
from kubegpu.core.quantity import MAX_QUANTITY, QuantityError, parse_quantity, to_int, to_milli
from kubegpu.scheduler import simulate
from kubegpu.scheduler.simulate import SimulationError, load_documents

SECONDS = 0.5  # per input, with a wide margin: every decoder answers these in well under 10 ms
KEY = b"k" * 32
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def promptly() -> Iterator[None]:
    """The block costs less than `SECONDS` of this thread's CPU (wall time would count the other processes that
    share the machine's cores)."""
    started = time.thread_time()
    yield
    elapsed = time.thread_time() - started
    assert elapsed < SECONDS, f"took {elapsed:.2f}s of CPU"


def answers(decode: Callable[[Any], Any], value: Any, error: type[InputError]) -> Any:
    """`decode(value)`, or None when it refused with `error`; any other exception fails the test."""
    with promptly():
        try:
            return decode(value)
        except error as exc:
            text = str(exc)
            assert "\n" not in text and len(text) < 1000, text
            return None


# ------------------------------------------------------------------------------------------------------------
# Inputs: arbitrary values, and the adversarial ones a reviewer tries first
# ------------------------------------------------------------------------------------------------------------

any_text = st.text(st.characters(exclude_categories=()), max_size=60)  # surrogates included
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(),
    any_text,
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4), max_leaves=20
)


def _nested(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


POISON_JSON = [
    _nested(3000),
    '{"a":' * 3000 + "1" + "}" * 3000,
    "1" + "0" * 5000,
    "-" + "9" * 5000,
    "1e600000",
    '"' + "x" * 300_000 + '"',
    '"\\ud800"',
    "NaN",
    "Infinity",
    "[1e400]",
    "\x00",
]


def _allocation(**fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "version": 1,
        "node": "n",
        "podUID": "u",
        "containers": {"main": {"nvidia.com/gpu": ["0"]}},
    }
    document.update(fields)
    return document


allocation_documents = st.builds(
    _allocation,
    **{
        name: st.one_of(json_values, st.sampled_from([_nested(40), "é" * 64, "0" * 64, 10**20]))
        for name in ("node", "podUID", "containers", "shares", "plugins", "issued", "signature")
    },
)


def _json_text(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False)


annotation_texts = st.one_of(
    any_text,
    json_values.map(_json_text),
    allocation_documents.map(_json_text),
    st.sampled_from(POISON_JSON),
    st.sampled_from(POISON_JSON).map(
        lambda poison: '{"version":1,"node":"n","podUID":"u","containers":{},"plugins":{"p":' + poison + "}}"
    ),
    st.sampled_from(POISON_JSON).map(lambda poison: '{"version":1,"inventories":{"nvidia":' + poison + "}}"),
)


# ------------------------------------------------------------------------------------------------------------
# Annotation codec
# ------------------------------------------------------------------------------------------------------------


@FUZZ
@given(value=st.one_of(annotation_texts, json_values))
@example(value=_json_text(_allocation(signature="é" * 64)))
@example(value='{"version": 1, "node": "n", "podUID": "u", "containers": {}, "issued": ' + "1" * 5000 + "}")
def test_the_allocation_codec_answers_every_input_with_a_record_or_an_annotation_error(value: Any) -> None:
    record = answers(decode_allocation, value, AnnotationError)
    if record is None:
        return
    with promptly():
        assert verify_allocation(record, KEY) in (True, False)
        assert verify_allocation(sign_allocation(record, KEY), KEY)


@FUZZ
@given(signature=st.one_of(any_text, st.text("0123456789abcdefABCDEF", min_size=63, max_size=65), st.none()))
def test_a_signature_that_is_not_64_lowercase_hex_digits_never_verifies(signature: str | None) -> None:
    record = AllocationRecord.model_validate(_allocation(signature=signature))

    with promptly():
        verified = verify_allocation(record, KEY)

    assert verified is False or signature == sign_allocation(record, KEY).signature


@FUZZ
@given(value=st.one_of(annotation_texts, json_values))
def test_the_devices_codec_answers_every_input_with_inventories_or_an_annotation_error(value: Any) -> None:
    answers(decode_devices, value, AnnotationError)


# ------------------------------------------------------------------------------------------------------------
# Quantities
# ------------------------------------------------------------------------------------------------------------

quantity_texts = st.one_of(
    any_text,
    st.from_regex(r"[+-]?[0-9]{0,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,9}|[KMGTPE]i|[numkKMGTPE])?", fullmatch=True),
    st.sampled_from(["1e600000", "1e-600000", "9" * 64, "9" * 65, "8Ei", "7.99Ei", "1_000", "١٢", "0x10", " 4 "]),
)


@FUZZ
@given(value=st.one_of(quantity_texts, scalars, json_values))
def test_a_quantity_is_bounded_or_refused_with_a_quantity_error(value: Any) -> None:
    parsed = answers(parse_quantity, value, QuantityError)
    if parsed is None:
        return
    assert isinstance(parsed, Decimal) and abs(parsed) <= MAX_QUANTITY
    with promptly():
        assert abs(to_int(value)) <= MAX_QUANTITY + 1
        assert abs(to_milli(value)) <= (MAX_QUANTITY + 1) * 1000


# ------------------------------------------------------------------------------------------------------------
# Manifests
# ------------------------------------------------------------------------------------------------------------

resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "aws.amazon.com/neurondevice", "hugepages-2Mi"])
amounts = st.one_of(quantity_texts, scalars)
resource_maps = st.dictionaries(st.one_of(resource_names, any_text), amounts, max_size=3)
containers = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["main", "side"]), any_text)},
    optional={"resources": st.fixed_dictionaries({}, optional={"limits": resource_maps, "requests": resource_maps})},
)
pods = st.builds(
    lambda spec_containers, init, metadata: {
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": spec_containers, "initContainers": init},
    },
    st.lists(containers, max_size=3),
    st.lists(containers, max_size=2),
    st.one_of(st.fixed_dictionaries({"name": st.just("p")}), json_values),
)
nodes = st.builds(
    lambda allocatable, annotations: {
        "kind": "Node",
        "metadata": {"name": "n", "annotations": annotations},
        "status": {"allocatable": allocatable},
    },
    resource_maps,
    st.one_of(st.just({}), st.dictionaries(st.just("kubegpu.io/devices"), annotation_texts, max_size=1)),
)


@FUZZ
@given(document=st.one_of(pods, json_values))
def test_a_pod_manifest_gives_a_request_or_a_manifest_error(document: Any) -> None:
    answers(pod_request, document, ManifestError)


@FUZZ
@given(document=st.one_of(nodes, json_values))
def test_a_node_manifest_gives_node_info_or_a_manifest_error(document: Any) -> None:
    answers(node_info, document, ManifestError)


# ------------------------------------------------------------------------------------------------------------
# `kubegpu simulate` input files
# ------------------------------------------------------------------------------------------------------------

YAML_ALPHABET = "[]{}:-?,&*!<| \n\t#'\"ak1.e\r\x85"
yaml_ish = st.text(st.sampled_from(YAML_ALPHABET), max_size=200)
YAML_TOKENS = [
    *("!!int ", "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!set ", "!!omap ", "!!pairs ", "!!null "),
    *("!!str ", "!!seq ", "!!map ", "!<tag:yaml.org,2002:int> ", "<<: ", "&a ", "*a ", "? ", ": ", "- ", "[", "]"),
    *("{", "}", ", ", "\n", "  ", "x", "1", "2001-02-30", '""', "'", "0x", "0b", "1:2", ".", "-", "~", "=", "---\n"),
]
yaml_tokens = st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join)
POISON_YAML = [
    "x: " + _nested(30_000),
    "x: " + "{a: " * 20_000 + "}" * 20_000,
    "- " * 30_000 + "x",
    "\n".join(["m0: &m0 {k0: 0, k1: 1}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}" for i in range(1, 27)]),
    "\n".join(["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]),
    "n: " + "1" * 5000,
    "n: " + "1:" * 3000 + "1",
    "a: &a [*a]",
    "kind: List\nitems: &i [*i]",
]


def _dumped(document: Any, flow: bool | None, indent: int) -> str:
    return yaml.safe_dump(document, default_flow_style=flow, indent=indent, allow_unicode=True)


input_files = st.one_of(
    st.binary(max_size=300),
    yaml_ish.map(str.encode),
    yaml_tokens.map(str.encode),
    any_text.map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.builds(
        _dumped, st.one_of(pods, nodes, json_values), st.sampled_from([None, True, False]), st.integers(2, 9)
    ).map(str.encode),
    st.sampled_from(POISON_YAML).map(str.encode),
)
_FILES = Path(tempfile.mkdtemp(prefix="kubegpu-fuzz-"))


@FUZZ
@given(data=input_files)
def test_a_simulator_input_file_loads_or_is_refused_with_a_simulation_error(data: bytes) -> None:
    path = _FILES / "input"
    path.write_bytes(data)

    with promptly():
        try:
            load_documents([path])
        except SimulationError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)


def _depth(node: Any, seen: frozenset[int] = frozenset()) -> int:
    if id(node) in seen or not isinstance(node, (list, dict)):
        return 0
    children = node.values() if isinstance(node, dict) else node
    return 1 + max((_depth(c, seen | {id(node)}) for c in children), default=0)


nested_documents = st.recursive(
    st.sampled_from(["x", 1, None]),
    lambda inner: st.lists(inner, min_size=1, max_size=2) | st.dictionaries(st.sampled_from("ab"), inner, min_size=1),
    max_leaves=160,
)


@settings(max_examples=200, deadline=None)
@given(
    document=nested_documents,
    flow=st.sampled_from([None, True, False]),
    indent=st.integers(2, 9),
    prefix=st.sampled_from(["", "- ", "a:\n  ", "- - "]),
)
@example(document=[[[[["x"]]]]], flow=False, indent=2, prefix="- " * 45)
def test_the_fast_yaml_path_is_taken_only_for_text_that_cannot_nest_too_deep(
    document: Any, flow: bool | None, indent: int, prefix: str
) -> None:
    text = prefix + _dumped(document, flow, indent)
    try:
        loaded = yaml.load(text, Loader=simulate._CheckedLoader)
    except yaml.YAMLError:
        return
    if simulate._plainly_shallow(text):
        assert _depth(loaded) <= simulate.MAX_DEPTH
        assert yaml.load(text, Loader=simulate._FastLoader) == loaded


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (Path(__file__).parents[2] / "examples" / "clusters").glob("*.yaml"))
)
def test_both_yaml_loaders_read_the_examples_alike_and_the_examples_take_the_fast_one(name: str) -> None:
    text = (Path(__file__).parents[2] / "examples" / "clusters" / name).read_text()

    assert simulate._plainly_shallow(text)
    assert list(yaml.load_all(text, Loader=simulate._FastLoader)) == list(
        yaml.load_all(text, Loader=simulate._CheckedLoader)
    )
