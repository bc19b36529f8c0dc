"""The pod fields of Kubernetes 1.24-1.33 that shape topology spread and pod affinity, read from pods in the exact
upstream shape (`core/v1` of 1.34) and scheduled as kube-scheduler schedules them.

* `topologySpreadConstraints[].minDomains`, `nodeAffinityPolicy`, `nodeTaintsPolicy`, `matchLabelKeys`: the plugin's
  rows are in `upstream/test_podtopologyspread_policies.py`; here the decoder's refusals and a rollout story.
* `podAffinity`/`podAntiAffinity` terms' `matchLabelKeys` and `mismatchLabelKeys` (1.29, beta and on from 1.31): the
  API server merges them into the term's selector when it creates the pod (`key In (value)` / `key NotIn (value)`,
  pkg/registry/core/pod/strategy.go `applyMatchLabelKeysAndMismatchLabelKeys`), so a pod read back from a 1.31+
  server carries both the keys and the merged requirements; kubegpu merges them for pods no server created yet (the
  simulator's files) and never twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.manifests import ManifestError, node_info, pod_request
from kubegpu.core.models import Requirement
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import filters
from kubegpu.scheduler.engine import Engine

HOST = "kubernetes.io/hostname"


def pod(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def anti_affinity(**term: Any) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": HOST, **term}]}}


def cluster(*placed: tuple[dict[str, Any], str]) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    for name in ("n1", "n2"):
        e.add_node(node_info(node_manifest(name, labels={HOST: name})))
    for document, where in placed:
        assert e.admit_bound(pod_request(document)[0], where, None).ok
    return e


def test_a_new_revision_spreads_apart_from_itself_not_from_the_old_one_by_match_label_keys() -> None:
    """A Deployment's pods keep apart per host, counting only their own revision (`pod-template-hash`), as the
    Kubernetes docs' rolling-update example: the old revision's pod on n1 does not push the new one away."""
    old = pod("web-old", {"app": "web", "pod-template-hash": "old"})
    term = {"labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["pod-template-hash"]}
    new = pod_request(pod("web-new", {"app": "web", "pod-template-hash": "new"}, affinity=anti_affinity(**term)))[0]
    assert cluster((old, "n1")).filter_node("n1", new).ok
    plain = {"labelSelector": {"matchLabels": {"app": "web"}}}
    without = pod_request(pod("web-new", {"app": "web", "pod-template-hash": "new"}, affinity=anti_affinity(**plain)))
    refused = cluster((old, "n1")).filter_node("n1", without[0])
    assert filters.ANTI_AFFINITY_RULES in refused.reasons


def test_mismatch_label_keys_keep_each_tenant_on_hosts_of_its_own() -> None:
    """The KEP's exclusive-tenant example: a pod refuses hosts running another tenant's pods, not its own tenant's."""
    term = {"labelSelector": {"matchExpressions": [{"key": "tenant", "operator": "Exists"}]}}
    document = pod("a-2", {"tenant": "a"}, affinity=anti_affinity(**term, mismatchLabelKeys=["tenant"]))
    e = cluster((pod("a-1", {"tenant": "a"}), "n1"), (pod("b-1", {"tenant": "b"}), "n2"))
    request = pod_request(document)[0]
    assert e.filter_node("n1", request).ok
    assert filters.ANTI_AFFINITY_RULES in e.filter_node("n2", request).reasons
    assert e.schedule(request).node == "n1"


def test_a_pod_the_server_already_merged_is_not_merged_again() -> None:
    """A pod as a 1.31+ API server returns it: the keys and the requirements it merged from them, both; a later
    change of the pod's label does not add a second requirement (the server merged once, at creation)."""
    term = {
        "labelSelector": {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "pod-template-hash", "operator": "In", "values": ["v1"]}],
        },
        "matchLabelKeys": ["pod-template-hash"],
    }
    request = pod_request(pod("web", {"app": "web", "pod-template-hash": "v2"}, affinity=anti_affinity(**term)))[0]
    (read,) = request.pod_anti_affinity
    assert read.selector is not None
    assert read.selector.requirements == (
        Requirement("app", "In", ("web",)),
        Requirement("pod-template-hash", "In", ("v1",)),
    )


def test_a_1_34_spread_constraint_in_the_exact_upstream_shape_is_read_whole() -> None:
    constraint = {
        "maxSkew": 1,
        "minDomains": 3,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
        "matchLabelKeys": ["pod-template-hash"],
        "nodeAffinityPolicy": "Ignore",
        "nodeTaintsPolicy": "Honor",
    }
    document = pod("web", {"app": "web", "pod-template-hash": "abc"}, topologySpreadConstraints=[constraint])
    (read,) = pod_request(document)[0].spread
    assert (read.min_domains, read.node_affinity_policy, read.node_taints_policy) == (3, "Ignore", "Honor")
    assert read.selector is not None
    assert read.selector.requirements == (
        Requirement("app", "In", ("web",)),
        Requirement("pod-template-hash", "In", ("abc",)),
    )


SPREAD = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
SPREAD_AT = "Pod.spec.topologySpreadConstraints[0]"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"topologySpreadConstraints": [{**SPREAD, "minDomains": 0}]},
            f"{SPREAD_AT}.minDomains: Input should be greater than or equal to 1",
            id="minDomains-zero",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}]},
            "Pod.spec.topologySpreadConstraints[0].minDomains: can only be used with whenUnsatisfiable: "
            "DoNotSchedule, not ScheduleAnyway",
            id="minDomains-soft",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**SPREAD, "nodeTaintsPolicy": "honor"}]},
            f"{SPREAD_AT}.nodeTaintsPolicy: Input should be 'Honor' or 'Ignore'",
            id="policy-case",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**SPREAD, "matchLabelKeys": ["app", "bad key"]}]},
            "Pod.spec.topologySpreadConstraints[0].matchLabelKeys[1]: 'bad key' is not a valid label key",
            id="spread-bad-key",
        ),
        pytest.param(
            {"affinity": anti_affinity(labelSelector={}, matchLabelKeys=["app"], mismatchLabelKeys=["app"])},
            "Pod.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].mismatchLabelKeys: "
            "'app' is also in matchLabelKeys",
            id="both-lists",
        ),
        pytest.param(
            {"affinity": anti_affinity(matchLabelKeys=["app"])},
            "Pod.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].matchLabelKeys: "
            "must not be set when labelSelector is not set",
            id="keys-without-selector",
        ),
        pytest.param(
            {"affinity": anti_affinity(labelSelector={}, mismatchLabelKeys=["-app"])},
            "Pod.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]."
            "mismatchLabelKeys[0]: '-app' is not a valid label key",
            id="affinity-bad-key",
        ),
    ],
)
def test_malformed_values_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError) as refused:
        pod_request(pod("p", {"app": "web"}, **spec))
    assert message in str(refused.value)


def test_spread_domains_remembered_for_a_tolerating_pod_are_not_another_pods() -> None:
    """nodeTaintsPolicy: Honor counts a tainted node only for a pod tolerating its taint, so the engine's memo of
    the counted nodes is keyed by the tolerations: asked for a tolerating pod first, then for one that does not,
    the second is still judged on the untainted nodes alone (min 1 there, so n1 fits it), not on the first's."""
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    taint = {"key": "example.com/dedicated", "effect": "NoSchedule"}
    for name in ("n1", "n2", "n3"):
        taints = [taint] if name == "n3" else []
        e.add_node(node_info(node_manifest(name, labels={HOST: name}, taints=taints)))
    for name, where in (("web-1", "n1"), ("web-2", "n2")):
        assert e.admit_bound(pod_request(pod(name, {"app": "web"}))[0], where, None).ok
    constraint = {
        "maxSkew": 1,
        "topologyKey": HOST,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
        "nodeTaintsPolicy": "Honor",
    }
    toleration = {"key": "example.com/dedicated", "operator": "Exists"}
    tolerant = pod("web-3", {"app": "web"}, topologySpreadConstraints=[constraint], tolerations=[toleration])
    plain = pod("web-4", {"app": "web"}, topologySpreadConstraints=[constraint])
    assert not e.filter_node("n1", pod_request(tolerant)[0]).ok  # n3 counts (0 there): n1 would skew to 2
    assert e.filter_node("n1", pod_request(plain)[0]).ok  # n3 does not count: the minimum is 1
