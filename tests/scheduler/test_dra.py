"""DRA in the engine and the simulator: pods' ResourceClaims (named, or made from ResourceClaimTemplates) allocated
against ResourceSlices by DeviceClass and request CEL selectors, counts, `allocationMode: All`, `matchAttribute`, and
kubegpu's own topology rules for its drivers' devices; the allocation in the upstream shape of `status.allocation`.
Every object is in the exact upstream shape of `resource.k8s.io/v1` (Kubernetes 1.34), as `dra_objects` builds it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core import dra
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler.testing import (
    NEURON,
    claim,
    claim_pod,
    claim_spec,
    device_class,
    exactly,
    generic_slice,
    neuron_slice,
    simulate,
    template,
)

NEURON_CLASS = device_class("neuron", f'device.driver == "{NEURON}"')


def run(*documents: dict[str, Any]) -> list[dict[str, Any]]:
    return simulate(documents, plugins={})


def devices(event: dict[str, Any], ref: str = "dev") -> list[str]:
    return [r["device"] for r in event["claims"][ref]["allocation"]["devices"]["results"]]


def test_a_pod_with_a_template_claim_gets_its_devices_in_the_upstream_allocation_shape() -> None:
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 4),
        template("two", claim_spec(exactly("devs", "neuron", 2))),
        claim_pod("p", templates={"dev": "two"}),
    )
    (event,) = events
    assert event["event"] == "scheduled" and event["node"] == "n1"
    assert event["claims"] == {
        "dev": {
            "name": "p-dev",
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "devs", "driver": NEURON, "pool": "n1", "device": "neuron-0"},
                        {"request": "devs", "driver": NEURON, "pool": "n1", "device": "neuron-1"},
                    ],
                    "config": [],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": "p", "uid": events[0]["claims"]["dev"]["reservedFor"][0]["uid"]}
            ],
        }
    }


def test_a_device_is_never_allocated_twice_and_comes_back_with_its_pod() -> None:
    one = template("one", claim_spec(exactly("d", "neuron")))
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 2),
        one,
        claim_pod("a", templates={"dev": "one"}),
        claim_pod("b", templates={"dev": "one"}),
        claim_pod("c", templates={"dev": "one"}),
        claim_pod("a", templates={"dev": "one"}, deleted=True),
        claim_pod("d", templates={"dev": "one"}),
    )
    by_pod = {(e["pod"], e["event"]): e for e in events}
    held = devices(by_pod[("default/a", "scheduled")]), devices(by_pod[("default/b", "scheduled")])
    assert sorted(held[0] + held[1]) == ["neuron-0", "neuron-1"]
    assert by_pod[("default/c", "unschedulable")]["reason"] == "0/1 nodes are available: 1 cannot allocate all claims."
    assert devices(by_pod[("default/d", "scheduled")]) == held[0]  # a's device, given back with a


@pytest.mark.parametrize(
    ("class_selector", "request_selector", "expected"),
    [
        pytest.param('device.attributes["gpu.example.com"].model == "a100"', None, ["g1"], id="class-selector"),
        pytest.param(
            None,
            'device.capacity["gpu.example.com"].memory.compareTo(quantity("60Gi")) >= 0',
            ["g1"],
            id="capacity-quantity",
        ),
        pytest.param(None, '"nvlink" in device.attributes["other.example.com"]', None, id="missing-domain-empty-map"),
        pytest.param(None, 'device.attributes["gpu.example.com"].index > 0', ["g1"], id="int-attribute"),
    ],
)
def test_class_and_request_selectors_choose_devices(
    class_selector: str | None, request_selector: str | None, expected: list[str] | None
) -> None:
    piece = generic_slice(
        "n1",
        "gpu.example.com",
        [
            ("g0", {"model": {"string": "t4"}, "index": {"int": 0}}),
            ("g1", {"model": {"string": "a100"}, "index": {"int": 1}}),
        ],
    )
    piece["spec"]["devices"][0]["capacity"] = {"memory": {"value": "16Gi"}}
    piece["spec"]["devices"][1]["capacity"] = {"memory": {"value": "80Gi"}}
    selectors = (request_selector,) if request_selector else ()
    events = run(
        node_manifest("n1"),
        device_class("gpu", *((class_selector,) if class_selector else ())),
        piece,
        template("t", claim_spec(exactly("gpu", "gpu", 1, *selectors))),
        claim_pod("p", templates={"dev": "t"}),
    )
    if expected is None:
        assert events[0]["event"] == "unschedulable"
    else:
        assert devices(events[0]) == expected


def test_a_failing_expression_refuses_with_its_error_naming_the_claim_request_and_selector() -> None:
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 2),
        template("t", claim_spec(exactly("devs", "neuron", 1, 'device.attributes["neuron.kubegpu.io"].nope == 1'))),
        claim_pod("p", templates={"dev": "t"}),
    )
    reason = events[0]["reason"]
    assert events[0]["event"] == "unschedulable"
    assert "claim default/p-dev, request devs: selector #0: CEL runtime error" in reason, reason
    assert "nope" in reason


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        pytest.param("[1, 2].all(x, [3, 4].exists(y, y > x))", "a comprehension inside another", id="nested"),
        pytest.param(" || ".join(["true"] * 1001), "more than 1000 tokens", id="too-many-tokens"),
        pytest.param("(" * 2000 + "true" + ")" * 2000, "nested deeper than kubegpu", id="parentheses-2000-deep"),
        pytest.param("!" * 5000 + "true", "nested deeper than kubegpu", id="negations-5000-deep"),
        pytest.param("-" * 3000 + "1 == 1", "nested deeper than kubegpu", id="minus-3000-deep"),
        pytest.param("device.driver ==", "compilation failed", id="does-not-compile"),
        pytest.param("device.driver", "must evaluate to bool", id="not-a-bool"),
    ],
)
def test_an_expression_over_the_cost_bound_or_wrong_is_refused_with_why(expression: str, problem: str) -> None:
    events = run(
        node_manifest("n1"),
        device_class("bad", expression),
        neuron_slice("n1", 1),
        template("t", claim_spec(exactly("devs", "bad"))),
        claim_pod("p", templates={"dev": "t"}),
    )
    assert events[0]["event"] == "unschedulable"
    assert "class bad: selector #0: " in events[0]["reason"] and problem in events[0]["reason"], events[0]["reason"]


def test_allocation_mode_all_takes_every_matching_device_and_waits_while_one_is_in_use() -> None:
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 3),
        template("one", claim_spec(exactly("d", "neuron"))),
        template("all", claim_spec(exactly("d", "neuron", mode="All"))),
        claim_pod("everything", templates={"dev": "all"}),
        claim_pod("everything", templates={"dev": "all"}, deleted=True),
        claim_pod("single", templates={"dev": "one"}),
        claim_pod("everything-again", templates={"dev": "all"}),
    )
    assert devices(events[0]) == ["neuron-0", "neuron-1", "neuron-2"]
    assert events[2]["event"] == "scheduled"
    assert events[3]["event"] == "unschedulable"
    assert events[3]["reason"] == "0/1 nodes are available: 1 cannot allocate all claims."


def test_match_attribute_puts_the_devices_of_two_requests_on_one_value() -> None:
    domain = "gpu.example.com"
    piece = generic_slice(
        "n1",
        domain,
        [
            ("g0", {"numa": {"int": 0}, "kind": {"string": "gpu"}}),
            ("nic1", {"numa": {"int": 1}, "kind": {"string": "nic"}}),
            ("g1", {"numa": {"int": 1}, "kind": {"string": "gpu"}}),
        ],
    )
    spec = claim_spec(
        exactly("gpu", "any", 1, f'device.attributes["{domain}"].kind == "gpu"'),
        exactly("nic", "any", 1, f'device.attributes["{domain}"].kind == "nic"'),
        constraints=[{"requests": ["gpu", "nic"], "matchAttribute": f"{domain}/numa"}],
    )
    events = run(
        node_manifest("n1"), device_class("any"), piece, template("t", spec), claim_pod("p", templates={"dev": "t"})
    )
    assert devices(events[0]) == ["g1", "nic1"]  # g0 is first, but no NIC shares its NUMA node


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        pytest.param(
            [4, 8],
            [["neuron-0", "neuron-1", "neuron-2", "neuron-3"], [f"neuron-{i}" for i in range(8, 16)]],
            id="torus-rows-then-half",
        ),
        pytest.param([1, 4], [["neuron-0"], ["neuron-4", "neuron-5", "neuron-6", "neuron-7"]], id="a-row-left-whole"),
        pytest.param([7], None, id="seven-is-no-torus-set"),
    ],
)
def test_neuron_devices_are_chosen_by_the_torus_rule(counts: list[int], expected: list[list[str]] | None) -> None:
    documents: list[dict[str, Any]] = [
        node_manifest("trn"),
        NEURON_CLASS,
        neuron_slice("trn", 16, topology="torus", rows=4, columns=4),
    ]
    for i, count in enumerate(counts):
        documents.append(template(f"t{i}", claim_spec(exactly("d", "neuron", count))))
        documents.append(claim_pod(f"p{i}", templates={"dev": f"t{i}"}))
    events = run(*documents)
    if expected is None:
        assert events[0]["event"] == "unschedulable"
        assert events[0]["reason"] == "0/1 nodes are available: 1 cannot allocate all claims."
        return
    assert [devices(e) for e in events] == expected


def test_neuron_ring_windows_are_contiguous() -> None:
    """Devices 0 and 3 of a ring of 7 are taken: a request for 3 gets the window 4-6 (the first three free devices,
    1, 2 and 4, are no window), then a request for 2 the run 1-2."""
    taken = claim(
        "taken",
        claim_spec(exactly("d", "neuron", 2)),
        allocation={
            "devices": {
                "results": [{"request": "d", "driver": NEURON, "pool": "inf", "device": f"neuron-{i}"} for i in (0, 3)]
            }
        },
    )
    events = run(
        node_manifest("inf"),
        NEURON_CLASS,
        neuron_slice("inf", 7),
        taken,
        template("three", claim_spec(exactly("d", "neuron", 3))),
        template("two", claim_spec(exactly("d", "neuron", 2))),
        claim_pod("p", templates={"dev": "three"}),
        claim_pod("q", templates={"dev": "two"}),
    )
    assert devices(events[0]) == ["neuron-4", "neuron-5", "neuron-6"]
    assert devices(events[1]) == ["neuron-1", "neuron-2"]


def test_nvidia_gpus_are_chosen_within_an_nvlink_group() -> None:
    driver = "nvidia.kubegpu.io"
    piece = generic_slice(
        "p3",
        driver,
        [
            (f"gpu-{i}", {"index": {"int": i}, "gpuCount": {"int": 4}, "nvlinkGroup": {"string": str(i // 2)}})
            for i in range(4)
        ],
    )
    events = run(
        node_manifest("p3"),
        device_class("gpu", f'device.driver == "{driver}"'),
        piece,
        template("one", claim_spec(exactly("g", "gpu", 1))),
        template("two", claim_spec(exactly("g", "gpu", 2))),
        claim_pod("single", templates={"dev": "one"}),
        claim_pod("pair", templates={"dev": "two"}),
    )
    assert devices(events[0]) == ["gpu-0"]
    assert devices(events[1]) == ["gpu-2", "gpu-3"]  # one NVLink group, not gpu-1 and gpu-2


def test_a_named_claim_is_shared_by_its_pods_on_its_node() -> None:
    events = run(
        node_manifest("n1"),
        node_manifest("n2"),
        NEURON_CLASS,
        neuron_slice("n2", 1),
        claim("shared", claim_spec(exactly("d", "neuron"))),
        claim_pod("a", claims={"dev": "shared"}),
        claim_pod("b", claims={"dev": "shared"}),
    )
    assert [e["node"] for e in events] == ["n2", "n2"]
    assert devices(events[0]) == devices(events[1]) == ["neuron-0"]
    assert [c["name"] for c in events[1]["claims"]["dev"]["reservedFor"]] == ["a", "b"]


def test_a_claim_allocated_for_another_node_keeps_the_pod_off_this_one() -> None:
    allocated = claim(
        "elsewhere",
        claim_spec(exactly("d", "neuron")),
        allocation={
            "devices": {"results": [{"request": "d", "driver": NEURON, "pool": "n2", "device": "neuron-0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]
            },
        },
    )
    events = run(
        node_manifest("n1"),
        node_manifest("n2", taints=[{"key": "busy", "value": "yes", "effect": "NoSchedule"}]),
        NEURON_CLASS,
        neuron_slice("n1", 1),
        neuron_slice("n2", 1),
        allocated,
        claim_pod("p", claims={"dev": "elsewhere"}),
    )
    assert events[0]["event"] == "unschedulable"
    assert "1 resourceclaim not available on the node" in events[0]["reason"]


@pytest.mark.parametrize(
    ("documents", "reason"),
    [
        pytest.param([claim_pod("p", claims={"dev": "missing"})], 'resourceclaim "missing" not found', id="claim"),
        pytest.param(
            [template("t", claim_spec(exactly("devs", "missing"))), claim_pod("p", templates={"dev": "t"})],
            "request devs: device class missing does not exist",
            id="class",
        ),
        pytest.param([claim_pod("p", templates={"dev": "nope"})], 'resourceclaimtemplate "nope" not found', id="tmpl"),
    ],
)
def test_prefilter_refusals_in_kube_schedulers_words(documents: list[dict[str, Any]], reason: str) -> None:
    events = run(node_manifest("n1"), NEURON_CLASS, neuron_slice("n1", 1), *documents)
    assert events[-1]["event"] == "unschedulable"
    assert events[-1]["reason"] == f"0/1 nodes are available: {reason}."


def admin_namespace(name: str, value: str | None = "true") -> dict[str, Any]:
    """A Namespace as the API server serves it, labelled (or not) for DRA admin access (1.34's label key)."""
    labels = {"kubernetes.io/metadata.name": name}
    if value is not None:
        labels[dra.ADMIN_NAMESPACE_LABEL] = value
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def admin_request(name: str, device_class: str, mode: str = "All") -> dict[str, Any]:
    """A request with `exactly.adminAccess: true`, in the shape of `resource.k8s.io/v1` (DeviceRequest.Exactly,
    DRAAdminAccess: beta and on by default in Kubernetes 1.34 and 1.35)."""
    request = exactly(name, device_class, mode=mode)
    request["exactly"]["adminAccess"] = True
    return request


def test_admin_access_reaches_devices_other_claims_hold_and_holds_none_itself() -> None:
    # The story of a monitoring agent: a workload holds neuron-0; the agent's claim (admin access, All) gets both
    # devices, marked `adminAccess: true` as upstream writes them; a second workload still gets neuron-1.
    events = run(
        node_manifest("n1"),
        admin_namespace("default"),
        NEURON_CLASS,
        neuron_slice("n1", 2),
        template("one", claim_spec(exactly("d", "neuron"))),
        template("watch", claim_spec(admin_request("all", "neuron"))),
        claim_pod("a", templates={"dev": "one"}),
        claim_pod("agent", templates={"dev": "watch"}),
        claim_pod("b", templates={"dev": "one"}),
    )
    assert [e["event"] for e in events] == ["scheduled"] * 3
    assert devices(events[0]) == ["neuron-0"]
    assert events[1]["claims"]["dev"]["allocation"]["devices"]["results"] == [
        {"request": "all", "driver": NEURON, "pool": "n1", "device": "neuron-0", "adminAccess": True},
        {"request": "all", "driver": NEURON, "pool": "n1", "device": "neuron-1", "adminAccess": True},
    ]
    assert devices(events[2]) == ["neuron-1"], "admin access holds no device: b is not kept waiting"


@pytest.mark.parametrize(
    "documents",
    [
        pytest.param([], id="no-namespace-document"),
        pytest.param([admin_namespace("default", None)], id="unlabelled"),
        pytest.param([admin_namespace("default", "yes")], id="label-not-true"),
        pytest.param([admin_namespace("other")], id="another-namespace-labelled"),
    ],
)
def test_admin_access_is_refused_outside_a_labelled_namespace_in_the_api_servers_words(
    documents: list[dict[str, Any]],
) -> None:
    events = run(
        node_manifest("n1"),
        *documents,
        NEURON_CLASS,
        neuron_slice("n1", 2),
        template("watch", claim_spec(admin_request("all", "neuron"))),
        claim_pod("agent", templates={"dev": "watch"}),
    )
    assert events[0]["event"] == "unschedulable"
    assert events[0]["reason"] == (
        "0/1 nodes are available: request all: admin access to devices requires the "
        "`resource.kubernetes.io/admin-access: true` label on the containing namespace."
    )


def test_first_available_takes_the_first_alternative_that_fits() -> None:
    spec = claim_spec(
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "neuron", "count": 4},
                {"name": "small", "deviceClassName": "neuron", "count": 1},
            ],
        }
    )
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 2),
        template("t", spec),
        claim_pod("p", templates={"dev": "t"}),
    )
    results = events[0]["claims"]["dev"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in results] == [("gpu/small", "neuron-0")]


def test_only_the_newest_generation_of_a_pool_is_used() -> None:
    old = neuron_slice("n1", 4, generation=1)
    new = neuron_slice("n1", 1, generation=2)
    new["metadata"]["name"] = "n1-newer"
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        old,
        new,
        template("two", claim_spec(exactly("d", "neuron", 2))),
        claim_pod("p", templates={"dev": "two"}),
    )
    assert events[0]["event"] == "unschedulable"


def test_class_config_and_claim_config_are_written_with_their_source() -> None:
    opaque = {"driver": NEURON, "parameters": {"sharing": "none"}}
    spec = claim_spec(exactly("d", "neuron"))
    spec["devices"]["config"] = [{"requests": ["d"], "opaque": {"driver": NEURON, "parameters": {"x": 1}}}]
    events = run(
        node_manifest("n1"),
        device_class("neuron", f'device.driver == "{NEURON}"', config=[{"opaque": opaque}]),
        neuron_slice("n1", 1),
        template("t", spec),
        claim_pod("p", templates={"dev": "t"}),
    )
    assert events[0]["claims"]["dev"]["allocation"]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["d"], "opaque": opaque},
        {"source": "FromClaim", "requests": ["d"], "opaque": {"driver": NEURON, "parameters": {"x": 1}}},
    ]


# -- the decoders: upstream's bounds, errors naming the field ---------------------------------------------------------


def _with_config(spec: dict[str, Any], opaque: dict[str, Any]) -> dict[str, Any]:
    spec["devices"]["config"] = [{"opaque": {"driver": "a.example.com", **opaque}}]
    return spec


def _slice_with(**device: Any) -> dict[str, Any]:
    piece = neuron_slice("n1", 1)
    piece["spec"]["devices"][0].update(device)
    return piece


@pytest.mark.parametrize(
    ("decode", "document", "message"),
    [
        pytest.param(
            dra.resource_slice,
            {**neuron_slice("n1", 129)},
            "ResourceSlice.spec.devices: List should have at most 128",
            id="too-many-devices",
        ),
        pytest.param(
            dra.resource_slice,
            _slice_with(attributes={"model": {"string": "x" * 65}}),
            "ResourceSlice.spec.devices[0].attributes.model.string: String should have at most 64",
            id="long-attribute",
        ),
        pytest.param(
            dra.resource_slice,
            _slice_with(attributes={"index": {"int": 1, "bool": True}}),
            "ResourceSlice.spec.devices[0].attributes.index: exactly one of",
            id="two-values",
        ),
        pytest.param(
            dra.resource_slice,
            _slice_with(name="Neuron_0"),
            "ResourceSlice.spec.devices[0].name: ",
            id="bad-device-name",
        ),
        pytest.param(
            dra.resource_slice,
            _slice_with(consumesCounters=[{"counterSet": "x", "counters": {}}]),
            "consumesCounters (partitionable devices) is not supported",
            id="counters",
        ),
        pytest.param(
            dra.device_class,
            device_class("c", "x" * (10 * 1024 + 1)),
            "DeviceClass.spec.selectors[0].cel.expression: String should have at most 10240",
            id="long-cel",
        ),
        pytest.param(
            dra.device_class,
            {
                **device_class("c", "true"),
                "spec": {"config": [{"opaque": {"driver": "a.example.com", "parameters": {"x": "y" * 10240}}}]},
            },
            "DeviceClass.spec.config[0].opaque.parameters: at most 10240 bytes of JSON (upstream's bound), not 10248",
            id="large-class-parameters",
        ),
        pytest.param(
            dra.resource_claim_template,
            template("t", _with_config(claim_spec(exactly("d", "x")), {"parameters": ["y" * 2000] * 6})),
            "spec.spec.devices.config[0].opaque.parameters: at most 10240 bytes of JSON",
            id="large-claim-parameters",
        ),
        pytest.param(
            dra.resource_claim,
            claim("c", claim_spec(exactly("d", "x", 33))),
            "ResourceClaim.spec.devices.requests[0].exactly.count: Input should be less than or equal to 32",
            id="count",
        ),
        pytest.param(
            dra.resource_claim,
            claim("c", claim_spec(exactly("d", "x"), constraints=[{"requests": ["e"], "matchAttribute": "a.b/c"}])),
            "'e' names no request of this claim",
            id="constraint-request",
        ),
        pytest.param(
            dra.resource_claim_template,
            template("t", claim_spec({"name": "d"})),
            "exactly one of exactly or firstAvailable",
            id="no-exactly",
        ),
    ],
)
def test_decoders_refuse_naming_the_field(decode: Any, document: dict[str, Any], message: str) -> None:
    if decode in (dra.resource_claim, dra.resource_claim_template):
        # Read without its spec then, the reason kept: another scheduler's allocation of a claim still holds its
        # devices, a pod naming either is told why (tests/scheduler/test_live_dra.py), kubegpu allocates neither.
        found = decode(document)
        assert found.spec.requests == () and found.problem is not None and message in found.problem, found.problem
        return
    with pytest.raises(dra.DraError) as raised:
        decode(document)
    assert message in str(raised.value), str(raised.value)


def test_simulate_reads_the_dra_kinds_and_names_the_bad_document(tmp_path: Any) -> None:
    import yaml

    from kubegpu.scheduler.simulate import SimulationError, load_documents

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([node_manifest("n1"), _slice_with(name="BAD")]))
    with pytest.raises(SimulationError, match=r"cluster.yaml#2: ResourceSlice.spec.devices\[0\].name"):
        load_documents([path], [])
    # A claim whose spec kubegpu cannot read: the scheduler reads it without (its allocation still holds devices);
    # the simulator's file is the user's own, and refused naming the field.
    odd = claim("c", claim_spec(exactly("d", "x"), constraints=[{"distinctAttribute": "a.b/c"}]))
    path.write_text(yaml.safe_dump_all([node_manifest("n1"), odd]))
    with pytest.raises(SimulationError, match=r"cluster.yaml#2: ResourceClaim.spec.devices.constraints\[0\]"):
        load_documents([path], [])
    path.write_text(yaml.safe_dump_all([node_manifest("n1"), template("t", claim_spec({"name": "d"}))]))
    with pytest.raises(SimulationError, match=r"cluster.yaml#2: ResourceClaimTemplate.spec.spec.devices.requests\[0\]"):
        load_documents([path], [])


# -- the invariant: a device is never allocated to two claims ---------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "delete"]), st.integers(0, 7), st.integers(1, 3)), max_size=30))
def test_no_device_is_ever_held_by_two_claims(story: list[tuple[str, int, int]]) -> None:
    documents: list[dict[str, Any]] = [
        node_manifest("a"),
        node_manifest("b"),
        NEURON_CLASS,
        neuron_slice("a", 4),
        neuron_slice("b", 3),
        *(template(f"t{n}", claim_spec(exactly("d", "neuron", n))) for n in (1, 2, 3)),
    ]
    live: set[int] = set()
    for verb, pod, count in story:
        if verb == "add" and pod not in live:
            documents.append(claim_pod(f"p{pod}", templates={"dev": f"t{count}"}))
            live.add(pod)
        elif verb == "delete" and pod in live:
            documents.append(claim_pod(f"p{pod}", templates={"dev": "t1"}, deleted=True))
            live.discard(pod)
    holders: dict[tuple[str, str], str] = {}
    for event in run(*documents):
        if event["event"] == "scheduled":
            for result in event["claims"]["dev"]["allocation"]["devices"]["results"]:
                key = (result["pool"], result["device"])
                assert key not in holders, f"{key} held by {holders[key]} and {event['pod']}"
                assert result["pool"] == event["node"]
                holders[key] = event["pod"]
        elif event["event"] == "deleted":
            for key in [k for k, pod in holders.items() if pod == event["pod"]]:
                del holders[key]


def test_the_text_and_html_reports_show_each_claims_devices(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from kubegpu.cli import main

    path = tmp_path / "cluster.yaml"
    documents = [
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 2),
        template("t", claim_spec(exactly("d", "neuron", 2))),
        claim_pod("trainer", templates={"dev": "t"}),
    ]
    path.write_text(yaml.safe_dump_all(documents))
    assert main(["simulate", str(path), "--html", str(tmp_path / "report.html")]) == 0
    text = capsys.readouterr().out
    line = next(line for line in text.splitlines() if "default/trainer" in line)
    assert f"claims: dev={NEURON}/n1/neuron-0,{NEURON}/n1/neuron-1" in line, line
    html = (tmp_path / "report.html").read_text()
    assert '<section id="claims"><h2>DRA claims (1)</h2>' in html
    assert f"<td>trainer-dev</td><td>n1</td><td>{NEURON}/n1/neuron-0, {NEURON}/n1/neuron-1</td>" in html


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "delete"]), st.integers(0, 9), st.sampled_from(["t1", "t2", "t4", "shared"])),
        max_size=25,
    )
)
def test_the_engine_answers_alike_with_and_without_its_memos(story: list[tuple[str, int, str]]) -> None:
    """Every decision with DRA pods equals a fresh engine's (memos forgotten before each cycle): the node answers
    remembered per pod shape never outlive a claim or device change."""
    from kubegpu.core import dra as decode
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.core.plugin_manager import make_plugin_manager
    from kubegpu.scheduler.engine import Engine

    engines = [Engine(make_plugin_manager("scheduler", plugins=(), autoload=False)) for _ in range(2)]
    for engine in engines:
        for name in ("a", "b", "c"):
            engine.add_node(node_info(node_manifest(name)))
        found = decode.device_class(NEURON_CLASS)
        engine.set_device_class(found.name, found)
        for node, count, shape in (("a", 4, "ring"), ("b", 16, "torus"), ("c", 2, "ring")):
            piece = decode.resource_slice(neuron_slice(node, count, topology=shape, rows=4, columns=4))
            engine.set_resource_slice(piece.name, piece)
        for n in (1, 2, 4):
            made = decode.resource_claim_template(template(f"t{n}", claim_spec(exactly("d", "neuron", n))))
            engine.set_resource_claim_template(made.namespace, made.name, made)
        shared = decode.resource_claim(claim("shared", claim_spec(exactly("d", "neuron", 2))))
        engine.set_resource_claim(shared.namespace, shared.name, shared)
    live: set[int] = set()
    for verb, number, source in story:
        refs = {"claims": {"dev": "shared"}} if source == "shared" else {"templates": {"dev": source}}
        pod = pod_request(claim_pod(f"p{number}", **refs))[0]
        if verb == "add" and number not in live:
            fast = engines[0].schedule(pod)
            engines[1].forget_memos()
            slow = engines[1].schedule(pod)
            assert (fast.scheduled, fast.node, fast.reason, fast.claims) == (
                slow.scheduled,
                slow.node,
                slow.reason,
                slow.claims,
            )
            if fast.scheduled:
                live.add(number)
        elif verb == "delete" and number in live:
            for engine in engines:
                engine.release(pod.key)
            live.discard(number)


def test_a_device_another_scheduler_allocated_beside_this_ones_stays_held_until_both_claims_let_go() -> None:
    # Two schedulers racing on one device: kubegpu's pod holds neuron-0 by its claim, and another scheduler (which
    # did not see it yet) allocated neuron-0 to a second claim. The book kept one claim per device: the other's
    # allocation overwrote kubegpu's, and its deletion freed neuron-0 while kubegpu's pod still held it, so a third
    # pod was given it too.
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.core.plugin_manager import make_plugin_manager
    from kubegpu.scheduler.engine import Engine

    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    engine.add_node(node_info(node_manifest("n1")))
    engine.set_device_class("neuron", dra.device_class(NEURON_CLASS))
    piece = dra.resource_slice(neuron_slice("n1", 1))
    engine.set_resource_slice(piece.name, piece)
    spec = claim_spec(exactly("d", "neuron"))
    engine.set_resource_claim_template("default", "t", dra.resource_claim_template(template("t", spec)))
    first = engine.schedule(pod_request(claim_pod("first", templates={"dev": "t"}))[0])
    assert first.scheduled and devices({"claims": first.claims}) == ["neuron-0"]

    results = [{"request": "d", "driver": NEURON, "pool": "n1", "device": "neuron-0"}]
    racing = dra.resource_claim(claim("racing", spec, allocation={"devices": {"results": results}}))
    engine.set_resource_claim("default", "racing", racing)
    engine.set_resource_claim("default", "racing", None)  # the other scheduler's pod is gone

    third = engine.schedule(pod_request(claim_pod("third", templates={"dev": "t"}))[0])
    assert not third.scheduled, "neuron-0 is still held by the first pod's claim"
    engine.release("default/first")
    assert engine.schedule(pod_request(claim_pod("third", templates={"dev": "t"}))[0]).scheduled


def test_a_claim_whose_alternatives_multiply_is_refused_within_a_bounded_search() -> None:
    # Seven requests of eight firstAvailable alternatives each, and a last request no node can meet: the depth-first
    # search tried every combination of the others before giving up on each node, 8^7 of them (40 s of CPU; one
    # request more, eight times that): a tenant's template stalled the scheduler.
    from time import process_time

    requests = [
        {"name": f"r{i}", "firstAvailable": [{"name": f"a{j}", "deviceClassName": "neuron"} for j in range(8)]}
        for i in range(7)
    ]
    spec = claim_spec(*requests, exactly("last", "neuron", 32))
    started = process_time()
    events = run(
        node_manifest("n1"),
        NEURON_CLASS,
        neuron_slice("n1", 16),
        template("t", spec),
        claim_pod("p", templates={"dev": "t"}),
        template("small", claim_spec(exactly("d", "neuron", 2))),
        claim_pod("q", templates={"dev": "small"}),
    )
    elapsed = process_time() - started
    assert events[0]["event"] == "unschedulable"
    assert "claim default/p-dev: more than 2000 tries" in events[0]["reason"], events[0]["reason"]
    assert elapsed < 5, f"{elapsed:.1f} s of CPU"
    assert events[1]["event"] == "scheduled"  # the next pod's claim is allocated as ever


def test_a_selector_that_cannot_run_costs_one_compilation_not_one_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # A selector over kubegpu's token bound (the API server accepts it: 10 KiB) or one that does not compile was
    # compiled again for every device of other facts (each device has its own uuid upstream): 40 to 200 ms of Lark
    # each, per node per cycle, so one tenant's claim cost a 5,000-node cluster minutes of the scheduling thread.
    import celpy

    compiled = []
    compile_once = celpy.Environment.compile
    monkeypatch.setattr(
        celpy.Environment, "compile", lambda self, text: compiled.append(text) or compile_once(self, text)
    )
    over_bound = " || ".join(["false"] * 1001)  # (neither is compiled by another test before)
    nodes = [node_manifest(f"n{i}") for i in range(30)]
    slices = [generic_slice(f"n{i}", "gpu.example.com", [("g0", {"uuid": {"string": f"u{i}"}})]) for i in range(30)]
    for expression, problem in ((over_bound, "more than 1000 tokens"), ("device.driver == ==", "compilation failed")):
        compiled.clear()
        events = run(
            *nodes,
            device_class("bad", expression),
            *slices,
            template("t", claim_spec(exactly("devs", "bad"))),
            claim_pod("p", templates={"dev": "t"}),
        )
        assert events[0]["event"] == "unschedulable" and problem in events[0]["reason"], events[0]["reason"]
        assert len(compiled) == 1, f"compiled {len(compiled)} times for 30 nodes"


def test_the_compiled_selectors_kept_are_bounded_in_memory_not_in_count() -> None:
    # Each compiled program keeps cel-python's Lark tree, 3.4 MB for a list of 480 numbers (within the token bound,
    # 1 KiB of text), and 4,096 programs were kept (14 GB) for tenants writing that many distinct request selectors.
    import tracemalloc

    from kubegpu.scheduler import dracel

    device = dra.Device("gpu.example.com", "p", "g0", {}, {}, ())
    dracel.evaluate("true", device)  # the CEL environment, made once
    tracemalloc.start()
    try:
        for number in range(16):
            assert dracel.evaluate(f"[{number}{',1' * 479}].size() == 0", device) is False
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 40 << 20, f"{kept / 2**20:.0f} MiB kept after 16 selectors of a thousand characters"


def test_a_selector_within_the_token_bound_is_stopped_within_a_bounded_evaluation() -> None:
    # A comprehension over a list of 300 numbers whose body holds 80 comparisons is within the token bound (about
    # 1,000) and has no comprehension inside another; cel-python took 5-7 s to evaluate it, and it is evaluated
    # again for every device of other facts (each device has its own uuid upstream): hours of the scheduling thread
    # for one tenant's claim on a cluster of a few hundred GPUs.
    from time import process_time

    numbers = ",".join(["1"] * 300)
    expression = f"[{numbers}].all(x, {' && '.join(['x > 0'] * 80)})"
    slices = [generic_slice(f"n{i}", "gpu.example.com", [("g0", {"uuid": {"string": f"u{i}"}})]) for i in range(3)]
    started = process_time()
    events = run(
        *(node_manifest(f"n{i}") for i in range(3)),
        device_class("gpu", 'device.driver == "gpu.example.com"'),
        *slices,
        template("t", claim_spec(exactly("devs", "gpu", 1, expression))),
        claim_pod("p", templates={"dev": "t"}),
        template("plain", claim_spec(exactly("devs", "gpu", 1, "device.driver.startsWith('gpu')"))),
        claim_pod("q", templates={"dev": "plain"}),
    )
    elapsed = process_time() - started
    assert events[0]["event"] == "unschedulable", events[0]
    assert "request devs: selector #0: more than 5000 evaluation steps" in events[0]["reason"], events[0]["reason"]
    assert elapsed < 3, f"{elapsed:.1f} s of CPU"
    assert events[1]["event"] == "scheduled"  # the next pod's selector runs as ever


def test_a_pods_selectors_together_are_bounded_so_none_is_compiled_again_within_its_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The compiled programs kept are bounded in memory (2^15 parse-tree nodes); a pod whose selectors together need
    # more (seven of 5,000 nodes each: a list of 480 numbers beside a true comparison) evicted its own programs as it
    # went, and each was compiled again for every device of other facts: 50 ms a compilation, per selector, device
    # and node. Its selectors together are refused once, each compiled once.
    import celpy

    compiled = []
    compile_once = celpy.Environment.compile
    monkeypatch.setattr(
        celpy.Environment, "compile", lambda self, text: compiled.append(text) or compile_once(self, text)
    )
    requests = [
        exactly(f"r{number}", "gpu", 1, f'device.driver == "gpu.example.com" || [{number}{",1" * 479}].size() == 0')
        for number in range(7)
    ]
    nodes = [node_manifest(f"n{i}") for i in range(10)]
    slices = [
        generic_slice(f"n{i}", "gpu.example.com", [(f"g{d}", {"uuid": {"string": f"u{i}-{d}"}}) for d in range(7)])
        for i in range(10)
    ]
    events = run(
        *nodes,
        device_class("gpu", 'device.driver == "gpu.example.com"'),
        *slices,
        template("t", claim_spec(*requests)),
        claim_pod("p", templates={"dev": "t"}),
    )
    assert len(compiled) <= 8, f"compiled {len(compiled)} times"
    assert events[0]["event"] == "unschedulable", events[0]
    assert "selectors together are over kubegpu's cost bound" in events[0]["reason"], events[0]["reason"]
