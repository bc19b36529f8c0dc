"""The admission policies of `examples/deploy/admission/`, held to the upstream API's shape.

Device-plugin mode cannot remove the env a tenant writes into a container (docs/security.md, T22), so the cluster
refuses it with a ValidatingAdmissionPolicy. The API server these tests run against (1.20) does not serve that kind,
so the objects are checked here against the fields and values of `admissionregistration.k8s.io/v1` as the upstream
types declare them (k8s.io/api/admissionregistration/v1/types.go, introduced in 1.30), and the names the policy
refuses are held equal to the env every built-in plugin declares it owns. The CEL expressions are run with cel-python
(a test dependency, in the lock) on the pods a tenant would write.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy  # cel-python: a CEL evaluator, as the API server's admission evaluates the policies
import pytest
import yaml

from kubegpu.plugins.intel_gas import device as intel_device
from kubegpu.plugins.neuron import device as neuron_device
from kubegpu.plugins.nvidia import device as nvidia_device

ADMISSION = Path(__file__).resolve().parents[2] / "examples" / "deploy" / "admission"
API_VERSION = "admissionregistration.k8s.io/v1"
OWNED_ENV = {name for module in (nvidia_device, neuron_device, intel_device) for name in module.OWNED.envs}
OWNED_PREFIXES = {p for module in (nvidia_device, neuron_device, intel_device) for p in module.OWNED.env_prefixes}

# The json fields of the upstream v1 types, and the values their enums allow.
FIELDS: dict[str, set[str]] = {
    "ValidatingAdmissionPolicy": {"apiVersion", "kind", "metadata", "spec"},
    "ValidatingAdmissionPolicySpec": {
        "paramKind", "matchConstraints", "validations", "failurePolicy", "auditAnnotations", "matchConditions",
        "variables",
    },
    "Validation": {"expression", "message", "reason", "messageExpression"},
    "Variable": {"name", "expression"},
    "MatchResources": {"namespaceSelector", "objectSelector", "resourceRules", "excludeResourceRules", "matchPolicy"},
    "NamedRuleWithOperations": {"resourceNames", "operations", "apiGroups", "apiVersions", "resources", "scope"},
    "ValidatingAdmissionPolicyBinding": {"apiVersion", "kind", "metadata", "spec"},
    "ValidatingAdmissionPolicyBindingSpec": {"policyName", "paramRef", "matchResources", "validationActions"},
    "LabelSelector": {"matchLabels", "matchExpressions"},
    "LabelSelectorRequirement": {"key", "operator", "values"},
}  # fmt: skip
OPERATIONS = {"*", "CREATE", "UPDATE", "DELETE", "CONNECT"}
FAILURE_POLICIES = {"Ignore", "Fail"}
REASONS = {"Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge"}
ACTIONS = {"Deny", "Warn", "Audit"}
CEL_IDENTIFIER = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")


def documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted(ADMISSION.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def only(value: dict[str, Any], kind: str) -> None:
    unknown = set(value) - FIELDS[kind]
    assert not unknown, f"{kind} has no field {sorted(unknown)} in {API_VERSION}"


def check_match(match: dict[str, Any], *, rules_required: bool) -> None:
    only(match, "MatchResources")
    assert match.get("matchPolicy", "Equivalent") in ("Exact", "Equivalent")
    for key in ("namespaceSelector", "objectSelector"):
        selector = match.get(key) or {}
        only(selector, "LabelSelector")
        for requirement in selector.get("matchExpressions") or []:
            only(requirement, "LabelSelectorRequirement")
            assert requirement["operator"] in ("In", "NotIn", "Exists", "DoesNotExist")
    rules = match.get("resourceRules") or []
    assert rules or not rules_required, "a policy's matchConstraints need resourceRules"
    for rule in [*rules, *(match.get("excludeResourceRules") or [])]:
        only(rule, "NamedRuleWithOperations")
        assert set(rule["operations"]) <= OPERATIONS and rule["apiGroups"] and rule["apiVersions"]
        assert rule["resources"] and rule.get("scope", "*") in ("Cluster", "Namespaced", "*")


def test_every_object_has_the_shape_of_admissionregistration_v1() -> None:
    objects = documents()
    policies = {d["metadata"]["name"]: d for d in objects if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in objects if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert len(policies) + len(bindings) == len(objects) and policies and bindings
    for policy in policies.values():
        assert policy["apiVersion"] == API_VERSION
        only(policy, "ValidatingAdmissionPolicy")
        spec = policy["spec"]
        only(spec, "ValidatingAdmissionPolicySpec")
        assert spec.get("failurePolicy", "Fail") in FAILURE_POLICIES
        check_match(spec["matchConstraints"], rules_required=True)
        names = [v["name"] for v in spec.get("variables") or []]
        for variable in spec.get("variables") or []:
            only(variable, "Variable")
            assert CEL_IDENTIFIER.fullmatch(variable["name"]) and variable["expression"].strip()
        assert len(set(names)) == len(names)
        assert spec["validations"], "validations and auditAnnotations may not both be empty"
        for validation in spec["validations"]:
            only(validation, "Validation")
            assert validation["expression"].strip()
            assert "\n" not in validation["message"], "a message must not contain line breaks"
            assert validation.get("reason", "Invalid") in REASONS
            used = set(re.findall(r"variables\.([_a-zA-Z][_a-zA-Z0-9]*)", validation["expression"]))
            assert used <= set(names), f"{policy['metadata']['name']} uses undefined variables {used - set(names)}"
    for binding in bindings:
        assert binding["apiVersion"] == API_VERSION
        only(binding, "ValidatingAdmissionPolicyBinding")
        spec = binding["spec"]
        only(spec, "ValidatingAdmissionPolicyBindingSpec")
        assert spec["policyName"] in policies, f"binding {binding['metadata']['name']} names no shipped policy"
        actions = set(spec["validationActions"])
        assert actions and actions <= ACTIONS and not {"Deny", "Warn"} <= actions
        check_match(spec.get("matchResources") or {}, rules_required=False)
    assert {b["spec"]["policyName"] for b in bindings} == set(policies), "every policy is bound"


@pytest.mark.parametrize("policy", ["kubegpu-device-env", "kubegpu-device-env-from"])
def test_the_device_env_policies_name_exactly_the_env_the_plugins_own(policy: str) -> None:
    (found,) = [d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == policy]
    spec = found["spec"]
    owned = next(v["expression"] for v in spec["variables"] if v["name"] == "owned")
    assert set(re.findall(r"'([A-Z0-9_]+)'", owned)) == OWNED_ENV
    prefixes = next(v["expression"] for v in spec["variables"] if v["name"] == "ownedPrefixes")
    assert set(re.findall(r"'([A-Z0-9_]+)'", prefixes)) == OWNED_PREFIXES
    (validation,) = spec["validations"]
    assert all(name in validation["message"] for name in OWNED_ENV)
    assert all(f"{prefix.rstrip('_')}" in validation["message"] for prefix in OWNED_PREFIXES)
    containers = next(v["expression"] for v in spec["variables"] if v["name"] == "containers")
    assert all(kind in containers for kind in ("containers", "initContainers", "ephemeralContainers"))
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert set(rule["resources"]) == {"pods", "pods/ephemeralcontainers"}


def pod(**container: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", **container}]}}


TENANT_PODS = [
    ("plain", pod(), True, True),
    ("cuda-visible-devices", pod(env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]), True, True),
    ("nvidia-all", pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), False, True),
    ("neuron-cores", pod(env=[{"name": "NEURON_RT_VISIBLE_CORES", "value": "0-31"}]), False, True),
    (
        "init-container",
        {
            "spec": {
                "containers": [{"name": "main"}],
                "initContainers": [{"name": "i", "env": [{"name": "AWS_NEURON_VISIBLE_DEVICES", "value": "0"}]}],
            }
        },
        False,
        True,
    ),
    ("share-limit", pod(env=[{"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}]), False, True),
    ("share-memory-limit", pod(env=[{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}]), False, True),
    ("mps-threads", pod(env=[{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}]), False, True),
    ("cuda-cache-path", pod(env=[{"name": "CUDA_CACHE_PATH", "value": "/tmp"}]), True, True),
    ("env-from-cuda-prefix", pod(envFrom=[{"prefix": "CUDA_", "configMapRef": {"name": "x"}}]), True, False),
    ("env-from-mps-prefix", pod(envFrom=[{"prefix": "CUDA_MPS_X", "configMapRef": {"name": "x"}}]), True, False),
    ("env-from-without-prefix", pod(envFrom=[{"configMapRef": {"name": "x"}}]), True, False),
    ("env-from-app-prefix", pod(envFrom=[{"prefix": "APP_", "configMapRef": {"name": "x"}}]), True, True),
    ("env-from-nvidia-prefix", pod(envFrom=[{"prefix": "NVIDIA_", "configMapRef": {"name": "x"}}]), True, False),
]


@pytest.mark.parametrize(
    ("manifest", "env_ok", "env_from_ok"), [c[1:] for c in TENANT_PODS], ids=[c[0] for c in TENANT_PODS]
)
def test_the_cel_expressions_refuse_exactly_the_device_selecting_env(
    manifest: dict[str, Any], env_ok: bool, env_from_ok: bool
) -> None:
    environment = celpy.Environment()

    def evaluate(policy: dict[str, Any]) -> bool:
        variables: dict[Any, Any] = {}
        for variable in policy["spec"].get("variables") or []:
            activation = {"object": celpy.json_to_cel(manifest), "variables": celpy.celtypes.MapType(variables)}
            program = environment.program(environment.compile(variable["expression"]))
            variables[celpy.celtypes.StringType(variable["name"])] = program.evaluate(activation)
        activation = {"object": celpy.json_to_cel(manifest), "variables": celpy.celtypes.MapType(variables)}
        return all(
            bool(environment.program(environment.compile(v["expression"])).evaluate(activation))
            for v in policy["spec"]["validations"]
        )

    policies = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy"}
    assert evaluate(policies["kubegpu-device-env"]) == env_ok
    assert evaluate(policies["kubegpu-device-env-from"]) == env_from_ok
