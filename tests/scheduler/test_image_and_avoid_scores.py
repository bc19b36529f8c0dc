"""ImageLocality and NodePreferAvoidPods, table by table: the node that already holds a pod's images is preferred, and
a node that asks to avoid a pod's ReplicaSet gets it only when nothing else fits.

Expected values are kube-scheduler 1.20's formulas worked by hand in the comments; the stories run the engine on
nodes every filter passes, so only the scores decide.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.cli import main
from kubegpu.core.limits import MAX_IMAGE_NAME_LENGTH, MAX_NODE_IMAGE_NAMES
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import scores
from kubegpu.scheduler.config import parse_config
from kubegpu.scheduler.engine import Engine

MIB = 1024 * 1024
HOST = "kubernetes.io/hostname"
AVOID = "scheduler.alpha.kubernetes.io/preferAvoidPods"


def node(name: str, images: dict[str, int] | None = None, avoid: Any = None, **kwargs: Any) -> dict[str, Any]:
    """A Ready node listing `images` (name -> MiB) in `status.images`, asking to avoid `avoid` (a JSON value, or a
    raw annotation string)."""
    annotations = dict(kwargs.pop("annotations", {}))
    if avoid is not None:
        annotations[AVOID] = avoid if isinstance(avoid, str) else json.dumps(avoid)
    manifest = node_manifest(name, labels={HOST: name, **kwargs.pop("labels", {})}, annotations=annotations, **kwargs)
    manifest["status"]["images"] = [{"names": [n], "sizeBytes": mib * MIB} for n, mib in (images or {}).items()]
    return manifest


def engine(*nodes: dict[str, Any], profile: scores.Profile | None = None) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), scoring=profile)
    for manifest in nodes:
        e.add_node(node_info(manifest))
    return e


def owned(kind: str, uid: str, *, controller: bool = True) -> list[dict[str, Any]]:
    return [{"apiVersion": "apps/v1", "kind": kind, "name": f"{kind.lower()}-x", "uid": uid, "controller": controller}]


def pod(name: str, *images: str, owners: list[dict[str, Any]] | None = None, **spec: Any) -> PodRequest:
    containers = [{"name": f"c{i}", "image": image} for i, image in enumerate(images or ("busybox",))]
    document = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": owners or []},
        "spec": {"containers": containers, **spec},
    }
    return pod_request(document)[0]


def avoiding(*entries: tuple[str, str]) -> dict[str, Any]:
    return {
        "preferAvoidPods": [
            {"podSignature": {"podController": {"kind": kind, "name": "x", "uid": uid, "controller": True}},
             "reason": "some reason", "message": "some message"}
            for kind, uid in entries
        ]
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# ImageLocality
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("images", "held", "listed", "nodes", "expected"),
    [
        # 500 MiB on every node: 100 x (500 - 23) / (1000 - 23) = 47700 / 977 = 48.8 -> 48
        (["app:v1"], {"app:v1": 500}, {"app:v1": 4}, 4, 48),
        # on 2 of 4 nodes: 500 x 2/4 = 250 MiB; 100 x (250 - 23) / 977 = 22700 / 977 = 23.2 -> 23
        (["app:v1"], {"app:v1": 500}, {"app:v1": 2}, 4, 23),
        # 20 MiB is under the 23 MiB floor: 0
        (["app:v1"], {"app:v1": 20}, {"app:v1": 1}, 1, 0),
        # 2000 MiB is over the 1000 MiB ceiling of one container: 100
        (["app:v1"], {"app:v1": 2000}, {"app:v1": 1}, 1, 100),
        # two containers, 600 + 400 MiB: 100 x (1000 - 23) / (2000 - 23) = 97700 / 1977 = 49.4 -> 49
        (["a:1", "b:1"], {"a:1": 600, "b:1": 400}, {"a:1": 1, "b:1": 1}, 1, 49),
        # two containers, only one image here (800 MiB): 100 x (800 - 23) / 1977 = 77700 / 1977 = 39.3 -> 39
        (["a:1", "b:1"], {"a:1": 800}, {"a:1": 1, "b:1": 1}, 1, 39),
        # the same image in two containers counts twice: 100 x (800 - 23) / 1977 = 39
        (["a:1", "a:1"], {"a:1": 400}, {"a:1": 1}, 1, 39),
        # an image the node does not hold: the floor, 0
        (["a:1"], {"b:1": 900}, {"b:1": 1}, 1, 0),
    ],
    ids=["everywhere", "half-the-nodes", "under-floor", "over-ceiling", "two-containers", "one-of-two",
         "same-image-twice", "not-here"],
)  # fmt: skip
def test_image_locality_is_kube_schedulers_formula(
    images: list[str], held: dict[str, int], listed: dict[str, int], nodes: int, expected: int
) -> None:
    sizes = {name: mib * MIB for name, mib in held.items()}
    assert scores.image_locality(images, sizes, listed, nodes) == expected


@pytest.mark.parametrize(
    ("image", "normalized"),
    [
        ("nginx", "nginx:latest"),
        ("nginx:1.19", "nginx:1.19"),
        ("docker.io/library/nginx", "docker.io/library/nginx:latest"),
        ("registry:5000/team/app", "registry:5000/team/app:latest"),
        ("registry:5000/team/app:v2", "registry:5000/team/app:v2"),
        ("repo/app@sha256:0123", "repo/app@sha256:0123"),
    ],
)
def test_an_image_without_a_tag_is_read_as_latest(image: str, normalized: str) -> None:
    assert scores.normalized_image(image) == normalized


def test_the_node_holding_the_pods_image_is_preferred() -> None:
    # b holds the 600 MiB image alone of three nodes: 600 x 1/3 = 200 MiB -> 100 x 177 / 977 = 18 points on b.
    e = engine(node("a"), node("b", {"team/app:v1": 600}), node("c", {"other:v1": 900}))
    assert e.schedule(pod("p", "team/app:v1")).node == "b"
    # A pod naming the image without a tag asks for `:latest`, which no node lists: the first node in order.
    assert e.schedule(pod("q", "team/app")).node == "a"


def test_an_image_every_node_lists_at_different_sizes_still_tells_the_nodes_apart() -> None:
    # Ten nodes (more than the engine's sample of 8) all list app:v1, the last one at 900 MiB, the others at 30 MiB:
    # 900 x 10/10 -> 100 x 877 / 977 = 89 points on n9, 30 -> 0 points elsewhere. Every other score is alike, so n9
    # wins, as it does when an eleventh node without the image is added.
    nodes = [node(f"n{i}", {"app:v1": 30}) for i in range(9)] + [node("n9", {"app:v1": 900})]
    assert engine(*nodes).schedule(pod("p", "app:v1")).node == "n9"
    assert engine(node("m"), *nodes).schedule(pod("p", "app:v1")).node == "n9"


def test_a_profile_without_image_locality_ignores_images() -> None:
    profile = scores.Profile({scores.MOST_ALLOCATED: 1})
    e = engine(node("a"), node("b", {"team/app:v1": 600}), profile=profile)
    assert e.schedule(pod("p", "team/app:v1")).node == "a"


def test_a_nodes_image_list_is_bounded_and_read_leniently() -> None:
    manifest = node("big")
    manifest["status"]["images"] = [
        "not an object",
        {"names": "not a list", "sizeBytes": 1},
        {"names": ["negative"], "sizeBytes": -1},
        {"names": ["x" * (MAX_IMAGE_NAME_LENGTH + 1), "kept:v1"], "sizeBytes": 700 * MIB},
        *({"names": [f"image-{i}:v1", f"image-{i}@sha256:{i:064x}"], "sizeBytes": MIB} for i in range(10_000)),
    ]
    info = node_info(manifest)
    assert info.images["kept:v1"] == 700 * MIB
    assert len(info.images) <= MAX_NODE_IMAGE_NAMES
    assert all(len(name) <= MAX_IMAGE_NAME_LENGTH for name in info.images)
    assert "negative" not in info.images and "image-9999:v1" not in info.images


# ---------------------------------------------------------------------------------------------------------------
# NodePreferAvoidPods
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owners", "entries", "expected"),
    [
        (owned("ReplicaSet", "rs-1"), [("ReplicaSet", "rs-1")], 0),
        (owned("ReplicationController", "rc-1"), [("ReplicationController", "rc-1")], 0),
        (owned("ReplicaSet", "rs-1"), [("ReplicaSet", "rs-2")], 100),
        (owned("ReplicaSet", "rs-1"), [("ReplicationController", "rs-1")], 100),
        (owned("StatefulSet", "ss-1"), [("StatefulSet", "ss-1")], 100),
        (owned("ReplicaSet", "rs-1", controller=False), [("ReplicaSet", "rs-1")], 100),
        ([], [("ReplicaSet", "rs-1")], 100),
        (owned("ReplicaSet", "rs-1"), [], 100),
    ],
    ids=["replicaset", "replicationcontroller", "other-uid", "other-kind", "statefulset-never", "not-controller",
         "no-owner", "empty-list"],
)  # fmt: skip
def test_prefer_avoid_scores_zero_only_for_the_named_controller(
    owners: list[dict[str, Any]], entries: list[tuple[str, str]], expected: int
) -> None:
    avoided = scores.avoided_controllers(json.dumps(avoiding(*entries)))
    assert scores.prefer_avoid_score(scores.avoidance_key(pod("p", owners=owners)), avoided) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"preferAvoidPods": null}', frozenset()),
        ("null", frozenset()),
        ("{}", frozenset()),
        # Go's decoder matches field names regardless of case.
        ('{"PreferAvoidPods": [{"PodSignature": {"PodController": {"Kind": "ReplicaSet", "UID": "u"}}}]}',
         frozenset({("ReplicaSet", "u")})),
        ('{"preferAvoidPods": [{"podSignature": {}}, {"podSignature": {"podController": null}}]}', frozenset()),
    ],
    ids=["null-list", "null", "empty-object", "any-case", "no-controller"],
)  # fmt: skip
def test_prefer_avoid_annotations_read_as_kube_scheduler_reads_them(raw: str, expected: frozenset[Any]) -> None:
    assert scores.avoided_controllers(raw) == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{not json", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"preferAvoidPods": {}}', "preferAvoidPods: expected a list"),
        ('{"preferAvoidPods": [5]}', "preferAvoidPods[0]: expected an object"),
        ('{"preferAvoidPods": [{"podSignature": {"podController": {"uid": 7}}}]}', "podController.uid"),
        ('{"preferAvoidPods": [{"reason": 7}]}', "preferAvoidPods[0].reason"),
        ("[" * 100_000, "not JSON"),
    ],
    ids=["not-json", "not-an-object", "not-a-list", "entry-not-an-object", "uid-not-a-string", "reason-not-a-string",
         "nesting-bomb"],
)  # fmt: skip
def test_a_malformed_prefer_avoid_annotation_names_its_problem(raw: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        scores.avoided_controllers(raw)
    assert problem in str(caught.value)


def test_a_node_avoiding_the_pods_replicaset_gets_it_only_when_nothing_else_fits() -> None:
    # The pod prefers a (NodeAffinity: 100 x 1) but a avoids its ReplicaSet (NodePreferAvoidPods: 0 x 10000 there,
    # 100 x 10000 on b): b wins. Another ReplicaSet's pod is not avoided and follows its preference.
    prefer_a = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}}
    ]}}}  # fmt: skip
    e = engine(node("a", avoid=avoiding(("ReplicaSet", "rs-1"))), node("b"))
    assert e.schedule(pod("p1", owners=owned("ReplicaSet", "rs-1"), **prefer_a)).node == "b"
    assert e.schedule(pod("p2", owners=owned("ReplicaSet", "rs-2"), **prefer_a)).node == "a"
    # Only a fits (b is cordoned): the score never refuses.
    cordoned = node("b")
    cordoned["spec"]["unschedulable"] = True
    tight = engine(node("a", avoid=avoiding(("ReplicaSet", "rs-1"))), cordoned)
    assert tight.schedule(pod("p3", owners=owned("ReplicaSet", "rs-1"))).node == "a"


def test_a_malformed_annotation_costs_only_that_nodes_score_and_is_warned_about_once_per_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prefer_a = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}}
    ]}}}  # fmt: skip
    caplog.set_level(logging.WARNING, logger="kubegpu.engine")
    e = engine(node("a", avoid="{broken"), node("b", avoid=avoiding(("ReplicaSet", "rs-1"))))
    # a's annotation is read as absent: the pod's preference for a decides.
    assert e.schedule(pod("p1", owners=owned("ReplicaSet", "rs-1"), **prefer_a)).node == "a"
    e.add_node(node_info(node("a", avoid="{broken", labels={"changed": "yes"})))  # same value: no second warning
    e.add_node(node_info(node("a", avoid="[]")))  # another bad value: one more
    warnings = [r.getMessage() for r in caplog.records if AVOID in r.getMessage()]
    assert len(warnings) == 2 and "node a" in warnings[0] and "not JSON" in warnings[0]


def test_the_annotation_changing_is_seen_at_once() -> None:
    e = engine(node("a"), node("b"))
    rs = owned("ReplicaSet", "rs-1")
    assert e.schedule(pod("p1", owners=rs)).node == "a"
    e.add_node(node_info(node("a", avoid=avoiding(("ReplicaSet", "rs-1")))))
    assert e.schedule(pod("p2", owners=rs)).node == "b"
    e.add_node(node_info(node("a")))
    e.add_node(node_info(node("b", avoid=avoiding(("ReplicaSet", "rs-1")))))
    assert e.schedule(pod("p3", owners=rs)).node == "a"
    e.remove_node("b")
    assert e.schedule(pod("p4", owners=rs)).node == "a"


# ---------------------------------------------------------------------------------------------------------------
# Configuration and the default profile
# ---------------------------------------------------------------------------------------------------------------


def test_kube_schedulers_default_weights() -> None:
    weights = scores.Profile.default("spread").weights
    assert weights[scores.IMAGE_LOCALITY] == 1
    assert weights[scores.PREFER_AVOID] == 10000


@pytest.mark.parametrize(
    ("score", "expected"),
    [
        ({"disabled": [{"name": "ImageLocality"}]}, {"ImageLocality": 0, "NodePreferAvoidPods": 10000}),
        ({"disabled": [{"name": "NodePreferAvoidPods"}]}, {"ImageLocality": 1, "NodePreferAvoidPods": 0}),
        ({"enabled": [{"name": "ImageLocality", "weight": 5}]}, {"ImageLocality": 5, "NodePreferAvoidPods": 10000}),
        ({"disabled": [{"name": "*"}], "enabled": [{"name": "NodePreferAvoidPods"}]},
         {"ImageLocality": 0, "NodePreferAvoidPods": 10000}),
    ],
    ids=["image-off", "avoid-off", "image-weighted", "only-avoid"],
)  # fmt: skip
def test_a_configuration_weighs_and_disables_them(score: dict[str, Any], expected: dict[str, int]) -> None:
    document = {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"plugins": {"score": score}}],
    }
    profile = parse_config(document).profile
    assert {name: profile.weight(name) for name in expected} == expected


def test_a_disabled_prefer_avoid_lets_the_preference_win() -> None:
    prefer_a = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}}
    ]}}}  # fmt: skip
    weights = dict(scores.Profile.default().weights)
    del weights[scores.PREFER_AVOID]
    e = engine(node("a", avoid=avoiding(("ReplicaSet", "rs-1"))), node("b"), profile=scores.Profile(weights))
    assert e.schedule(pod("p", owners=owned("ReplicaSet", "rs-1"), **prefer_a)).node == "a"


# ---------------------------------------------------------------------------------------------------------------
# The simulator reads both from its input
# ---------------------------------------------------------------------------------------------------------------


def test_simulate_reads_node_images_annotations_and_pod_owners(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [node("n1", avoid=avoiding(("ReplicaSet", "web-rs"))), node("n2"), node("n3", {"ml/train:v3": 900})]
    pods = [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": f"web-{i}", "namespace": "default", "ownerReferences": owned("ReplicaSet", "web-rs")},
         "spec": {"containers": [{"name": "web", "image": "nginx:1.19"}]}}
        for i in range(2)
    ] + [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "default"},
         "spec": {"containers": [{"name": "main", "image": "ml/train:v3"}]}},
    ]  # fmt: skip
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([*nodes, *pods]))
    code = main(["simulate", "--json", "--policy", "spread", str(path)])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert code == 0
    placed = {e["pod"]: e["node"] for e in events}
    # n1 asks to avoid the web ReplicaSet: its pods go elsewhere though n1 is as empty as any.
    assert placed["default/web-0"] != "n1" and placed["default/web-1"] != "n1"
    # The training image is on n3 alone: 900 MiB x 1/3 = 300 MiB -> 100 x 277 / 977 = 28 points there.
    assert placed["default/train"] == "n3"


# ---------------------------------------------------------------------------------------------------------------
# The engine's remembered answers stay true (oracle: a fresh engine)
# ---------------------------------------------------------------------------------------------------------------

IMAGES = ["app:v1", "db:v2", "ml:v3"]


@st.composite
def node_states(draw: st.DrawFn, name: str) -> dict[str, Any]:
    images = {image: draw(st.sampled_from([30, 300, 3000])) for image in draw(st.sets(st.sampled_from(IMAGES)))}
    kind = draw(st.sampled_from(["none", "rs-a", "rs-b", "broken"]))
    avoid: Any = {"none": None, "broken": "{", "rs-a": avoiding(("ReplicaSet", "rs-a"))}.get(kind)
    if kind == "rs-b":
        avoid = avoiding(("ReplicaSet", "rs-b"), ("ReplicationController", "rs-a"))
    return node(name, images, avoid=avoid, cpu=draw(st.sampled_from(["4", "8"])))


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Steps: ("pod", (name, images, owner uid)), ("node", manifest) replacing a node, ("gone", name)."""
    steps: list[tuple[str, Any]] = []
    for i in range(draw(st.integers(2, 10))):
        step = draw(st.sampled_from(["pod", "pod", "node", "gone"]))
        if step == "pod":
            images = draw(st.lists(st.sampled_from([*IMAGES, "app"]), min_size=1, max_size=2))
            steps.append(("pod", (f"p{i}", images, draw(st.sampled_from(["rs-a", "rs-b", ""])))))
        elif step == "node":
            steps.append(("node", draw(node_states(draw(st.sampled_from(["a", "b", "c", "d"]))))))
        else:
            steps.append(("gone", draw(st.sampled_from(["a", "b", "c", "d"]))))
    return steps


def _probe(name: str, images: list[str], uid: str) -> PodRequest:
    return pod(name, *images, owners=owned("ReplicaSet", uid) if uid else [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=2, max_size=4, unique=True).flatmap(
    lambda names: st.tuples(st.just(names), st.tuples(*(node_states(n) for n in names)), workloads())))  # fmt: skip
def test_every_ranking_equals_a_fresh_engines(case: tuple[list[str], tuple[dict[str, Any], ...], Any]) -> None:
    """After every node change and placement, the engine ranks each probe as one built from scratch on the same
    nodes and pods does: the image counts and avoided controllers it keeps as nodes come and go are never stale."""
    _, manifests, steps = case
    e = engine(*manifests)
    current = {m["metadata"]["name"]: m for m in manifests}
    placed: list[tuple[PodRequest, str]] = []
    probes = [_probe("probe-a", ["app:v1", "db:v2"], "rs-a"), _probe("probe-b", ["ml:v3"], "rs-b"),
              _probe("probe-c", ["app"], "")]  # fmt: skip
    for step, value in steps:
        if step == "node":
            current[value["metadata"]["name"]] = value
            e.add_node(node_info(value))
        elif step == "gone" and value in current and len(current) > 1:
            del current[value]
            e.remove_node(value)
            placed = [(p, n) for p, n in placed if n != value]
        elif step == "pod":
            request = _probe(*value)
            decision = e.schedule(request)
            if decision.scheduled and decision.node is not None:
                placed.append((request, decision.node))
        fresh = engine(*current.values())
        for request, where in placed:
            assert fresh.reserve(request, where).scheduled
        for probe in probes:
            feasible = [n for n in e.nodes if e.filter_node(n, probe).ok]
            ours = e._rank(feasible, probe, e.plan(probe)) if feasible else None
            theirs = fresh._rank(feasible, probe, fresh.plan(probe)) if feasible else None
            assert ours == theirs
            assert e._sample_size(probe, e.plan(probe)) == fresh._sample_size(probe, fresh.plan(probe))
