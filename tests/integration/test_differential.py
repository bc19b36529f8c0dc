"""Differential test: kubegpu and the real kube-scheduler 1.20.2 on fresh copies of one random cluster.

A seeded workload without devices (30 nodes over three zones with labels, taints and cordons; 200 pods with node
affinity, pod affinity and anti-affinity, topology spread, host ports, tolerations and two priorities) is scheduled
twice on the real API server: first by kube-scheduler, then, on a fresh copy of the same nodes, by `kubegpu
scheduler`. The runs are sequential because kube-scheduler places pods with its scheduler name on any node it sees.

The judge is written here, from the Kubernetes documentation's rules, and shares no code with the engine: every
pod kubegpu bound satisfies every constraint in kubegpu's final state, and every pod either scheduler left pending
fits no node in that scheduler's final state (so neither left a pod out that it could have placed).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cluster import Cluster, config_flag, free_port, process, wait_for

SEED = 20201
ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
ZONES = ("a", "b", "c")
NODES, PODS = 30, 200
GI = 1 << 30


# ---------------------------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------------------------


def node_specs(chance: random.Random) -> list[dict[str, Any]]:
    nodes = []
    for i in range(NODES):
        name = f"n{i:02d}"
        taints = []
        if chance.random() < 0.15:
            taints.append({"key": "dedicated", "value": "batch", "effect": "NoSchedule"})
        if chance.random() < 0.15:
            taints.append({"key": "spot", "value": "yes", "effect": "PreferNoSchedule"})
        nodes.append(
            {
                "name": name,
                "labels": {HOST: name, ZONE: ZONES[i % 3], "disk": chance.choice(["ssd", "hdd"]),
                           "gen": str(chance.randint(1, 5))},
                "taints": taints,
                "unschedulable": chance.random() < 0.07,
                "cpu": chance.choice([2000, 4000, 8000]),
                "memory": chance.choice([4, 8, 16]) * GI,
                "pods": chance.choice([8, 12, 20]),
            }
        )  # fmt: skip
    return nodes


def selector(labels: dict[str, str]) -> dict[str, Any]:
    return {"matchLabels": labels}


def pod_specs(chance: random.Random) -> list[dict[str, Any]]:
    """Apps with a fixed constraint each, so that the final state can be judged term by term."""
    pods = []
    for i in range(PODS):
        app = chance.choice(["web", "db", "cache", "api", "batch", "edge", "plain", "plain"])
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {
                "cpu": f"{chance.choice([100, 250, 500, 1000])}m",
                "memory": f"{chance.choice([128, 256, 512, 1024])}Mi"}}}],
            "priorityClassName": chance.choice(["low", "high"]),
        }  # fmt: skip
        affinity: dict[str, Any] = {}
        if app == "web":  # one per host, in a zone where a db runs, would rather be on an ssd
            affinity["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "labelSelector": selector({"app": "web"})}
                ]
            }
            affinity["podAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": ZONE, "labelSelector": selector({"app": "db"})}
                ]
            }
            affinity["nodeAffinity"] = {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
                    }
                ]
            }
        elif app == "db":  # ssd only, newer generations, one per zone at most two
            affinity["nodeAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "disk", "operator": "In", "values": ["ssd"]},
                                {"key": "gen", "operator": "Gt", "values": ["2"]},
                            ]
                        }
                    ]
                }
            }
            affinity["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "labelSelector": selector({"app": "db"})}
                ]
            }
        elif app == "cache":  # all in one zone (self affinity), preferably near web
            affinity["podAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": ZONE, "labelSelector": selector({"app": "cache"})}
                ],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 20, "podAffinityTerm": {"topologyKey": HOST, "labelSelector": selector({"app": "web"})}}
                ],
            }
        elif app == "api":  # spread over zones, skew 1, and over hosts softly
            spec["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": ZONE,
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": selector({"app": "api"}),
                },
                {
                    "maxSkew": 1,
                    "topologyKey": HOST,
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": selector({"app": "api"}),
                },
            ]
        elif app == "batch":  # may use the dedicated nodes, zone a or b, not gen 1
            spec["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]
            affinity["nodeAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": ZONE, "operator": "In", "values": ["a", "b"]},
                                {"key": "gen", "operator": "NotIn", "values": ["1"]},
                            ]
                        }
                    ]
                }
            }
        elif app == "edge":  # a host port, tolerates cordons and everything PreferNoSchedule
            spec["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}]
            spec["tolerations"] = [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
                {"operator": "Exists", "effect": "PreferNoSchedule"},
            ]
            spec["nodeSelector"] = {"disk": chance.choice(["ssd", "hdd"])}
        if affinity:
            spec["affinity"] = affinity
        pods.append({"name": f"{app}-{i:03d}", "labels": {"app": app}, "spec": spec})  # fmt: skip
    return pods


# ---------------------------------------------------------------------------------------------------------------
# One run: a fresh copy of the nodes, the pods, one scheduler, until nothing changes
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    nodes: dict[str, dict[str, Any]]
    placed: dict[str, str] = field(default_factory=dict)  # pod name -> node
    pending: list[str] = field(default_factory=list)


def create_nodes(cluster: Cluster, nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        allocatable = {"cpu": f"{node['cpu']}m", "memory": str(node["memory"]), "pods": str(node["pods"])}
        cluster.create_ready_node(node["name"], labels=node["labels"], allocatable=allocatable)
        cluster.client.patch(
            f"/api/v1/nodes/{node['name']}",
            {"spec": {"taints": node["taints"] or None, "unschedulable": node["unschedulable"] or None}},
        )


def create_pods(cluster: Cluster, namespace: str, pods: list[dict[str, Any]], scheduler: str) -> None:
    cluster.create_namespace(namespace)
    for pod in pods:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod["name"], "namespace": namespace, "labels": pod["labels"]},
            "spec": {**pod["spec"], "schedulerName": scheduler, "automountServiceAccountToken": False},
        }
        cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)


def settle(cluster: Cluster, namespace: str, count: int, quiet: float = 4.0, timeout: float = 60.0) -> None:
    """Wait until every pod is bound or marked unschedulable, and nothing has changed for `quiet` seconds."""
    last: tuple[Any, ...] = ()
    since = time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        pods = cluster.pods(namespace)
        state = tuple(sorted((p["metadata"]["name"], p["spec"].get("nodeName") or "") for p in pods))
        decided = sum(
            1
            for p in pods
            if p["spec"].get("nodeName")
            or any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                   for c in (p.get("status") or {}).get("conditions") or [])
        )  # fmt: skip
        if state != last:
            last, since = state, time.monotonic()
        elif decided == count and time.monotonic() - since >= quiet:
            return
        time.sleep(0.25)
    raise AssertionError(f"the scheduler in {namespace} did not settle within {timeout:.0f}s")


def run(cluster: Cluster, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], namespace: str,
        scheduler: str, command: list[str], log: Path) -> Outcome:  # fmt: skip
    create_nodes(cluster, nodes)
    create_pods(cluster, namespace, pods, scheduler)
    with process(command, log):
        settle(cluster, namespace, len(pods))
    outcome = Outcome({n["name"]: n for n in nodes})
    for pod in cluster.pods(namespace):
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
        if node:
            outcome.placed[name] = node
        else:
            outcome.pending.append(name)
    cluster.cleanup()
    wait_for(lambda: not cluster.client.list("/api/v1/nodes")[0], 30, "the nodes of the run to be deleted")
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# The judge: Kubernetes' rules, written out again
# ---------------------------------------------------------------------------------------------------------------


def quantity(text: str) -> int:
    """cpu in millicores, memory in bytes: only the forms the workload writes."""
    if text.endswith("m"):
        return int(text[:-1])
    if text.endswith("Mi"):
        return int(text[:-2]) << 20
    return int(text)


def requests(pod: dict[str, Any]) -> tuple[int, int]:
    wanted = pod["spec"]["containers"][0]["resources"]["requests"]
    return quantity(wanted["cpu"]), quantity(wanted["memory"])


def tolerated(pod: dict[str, Any], taint: dict[str, str]) -> bool:
    for t in pod["spec"].get("tolerations", []):
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t["key"] == taint["key"] and (t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")):
            return True
    return False


def expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Gt":
        return key in labels and int(labels[key]) > int(values[0])
    raise AssertionError(f"the judge does not know {operator}")


def selects(labels_wanted: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in labels_wanted.items())


class Judge:
    """The final state of one run, and whether a pod satisfies (or would satisfy) every rule on a node."""

    def __init__(self, outcome: Outcome, pods: list[dict[str, Any]]) -> None:
        self.nodes = outcome.nodes
        self.pods = {p["name"]: p for p in pods}
        self.placed = outcome.placed

    def others_on(self, node: str, but: str) -> list[dict[str, Any]]:
        return [self.pods[name] for name, where in self.placed.items() if where == node and name != but]

    def domain(self, node: str, key: str) -> str | None:
        labels: dict[str, str] = self.nodes[node]["labels"]
        return labels.get(key)

    def matching_in_domain(self, key: str, value: str, labels: dict[str, str], but: str) -> int:
        return sum(
            1
            for name, where in self.placed.items()
            if name != but and self.domain(where, key) == value and selects(labels, self.pods[name]["labels"])
        )

    def broken(self, pod: dict[str, Any], node_name: str, *, arriving: bool) -> list[str]:
        """The rules `pod` breaks on `node_name`: placed there already (`arriving` False) or arriving now."""
        node, spec, name = self.nodes[node_name], pod["spec"], pod["name"]
        problems = []
        if node["unschedulable"] and not tolerated(
            pod, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        ):
            problems.append("cordoned")
        others = self.others_on(node_name, name)
        cpu, memory = requests(pod)
        used = [requests(p) for p in others]
        if cpu + sum(c for c, _ in used) > node["cpu"] or memory + sum(m for _, m in used) > node["memory"]:
            problems.append("resources")
        if len(others) + 1 > node["pods"]:
            problems.append("pods")
        ports = {p["hostPort"] for c in spec["containers"] for p in c.get("ports", [])}
        if ports & {p["hostPort"] for o in others for c in o["spec"]["containers"] for p in c.get("ports", [])}:
            problems.append("host port")
        if not selects(spec.get("nodeSelector", {}), node["labels"]):
            problems.append("node selector")
        affinity = spec.get("affinity", {})
        required = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        if required and not any(
            all(expression_holds(e, node["labels"]) for e in term["matchExpressions"])
            for term in required["nodeSelectorTerms"]
        ):
            problems.append("node affinity")
        for taint in node["taints"]:
            if taint["effect"] != "PreferNoSchedule" and not tolerated(pod, taint):
                problems.append(f"taint {taint['key']}")
        for term in affinity.get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []):
            key, wanted = term["topologyKey"], term["labelSelector"]["matchLabels"]
            if self.matching_in_domain(key, node["labels"][key], wanted, name):
                problems.append("anti-affinity")
        for term in affinity.get("podAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []):
            key, wanted = term["topologyKey"], term["labelSelector"]["matchLabels"]
            if self.matching_in_domain(key, node["labels"][key], wanted, name):
                continue
            anywhere = sum(1 for other in self.placed if other != name and selects(wanted, self.pods[other]["labels"]))
            if not (selects(wanted, pod["labels"]) and anywhere == 0):
                problems.append("pod affinity")
        for constraint in spec.get("topologySpreadConstraints", []):
            if constraint["whenUnsatisfiable"] != "DoNotSchedule":
                continue
            key, wanted = constraint["topologyKey"], constraint["labelSelector"]["matchLabels"]
            counts = {
                value: self.matching_in_domain(key, value, wanted, name)
                for value in {n["labels"][key] for n in self.nodes.values()}
            }
            mine = node["labels"][key]
            if arriving:
                skew = counts[mine] + 1 - min(counts.values())
            else:
                counts[mine] += 1
                skew = max(counts.values()) - min(counts.values())
            if skew > constraint["maxSkew"]:
                problems.append("topology spread")
        return problems


def judge_pending(judge: Judge, pending: list[str]) -> dict[str, str]:
    """Pods left pending that some node would take in the final state (should be none)."""
    missed = {}
    for name in pending:
        pod = judge.pods[name]
        for node in judge.nodes:
            if not judge.broken(pod, node, arriving=True):
                missed[name] = node
                break
    return missed


# ---------------------------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------------------------


def priority_classes(cluster: Cluster) -> None:
    for name, value in (("low", 0), ("high", 1000)):
        with contextlib.suppress(Exception):
            cluster.client.post(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                 "value": value, "preemptionPolicy": "Never"},
            )  # fmt: skip


def test_kubegpu_and_kube_scheduler_on_the_same_random_cluster(
    cluster: Cluster, key_file: Path, tmp_path: Path
) -> None:
    chance = random.Random(SEED)
    nodes, pods = node_specs(chance), pod_specs(chance)
    cluster.cleanup()
    priority_classes(cluster)
    config = tmp_path / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {cluster.kubeconfig}\n  qps: 1000\n  burst: 1000\n"
        "leaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: default-scheduler\n"
    )
    kube = run(
        cluster, nodes, pods, "diff-kube", "default-scheduler",
        [str(cluster.bin / "kube-scheduler"), config_flag(config), "--port=0", f"--secure-port={free_port()}",
         "--bind-address=127.0.0.1", f"--cert-dir={tmp_path / 'ks-certs'}",
         "--authentication-tolerate-lookup-failure", "-v=1"],
        tmp_path / "kube-scheduler.log",
    )  # fmt: skip
    ours = run(
        cluster, nodes, pods, "diff-kubegpu", "kubegpu",
        [sys.executable, "-m", "kubegpu", "scheduler", "--kubeconfig", str(cluster.kubeconfig),
         "--scheduler-name", "kubegpu",
         "--allocation-key-file", str(key_file), "--no-leader-elect", "--metrics-address", f"127.0.0.1:{free_port()}",
         "--kube-api-qps", "1000", "--kube-api-burst", "1000", "--node-leases", "off"],
        tmp_path / "kubegpu.log",
    )  # fmt: skip
    print(
        f"\nkube-scheduler placed {len(kube.placed)}/{PODS}, kubegpu {len(ours.placed)}/{PODS}; "
        f"by app: kube-scheduler {dict(Counter(n.split('-')[0] for n in kube.placed))}, "
        f"kubegpu {dict(Counter(n.split('-')[0] for n in ours.placed))}"
    )
    judge = Judge(ours, pods)
    broken = {name: judge.broken(judge.pods[name], node, arriving=False) for name, node in ours.placed.items()}
    assert {name: rules for name, rules in broken.items() if rules} == {}, "kubegpu placements that break a rule"
    assert judge_pending(judge, ours.pending) == {}, "pods kubegpu left pending that a node would take"
    # The same judge on kube-scheduler's run: the rules it writes down are kube-scheduler's.
    reference = Judge(kube, pods)
    assert {
        n: r for n, node in kube.placed.items() if (r := reference.broken(reference.pods[n], node, arriving=False))
    } == {}
    assert judge_pending(reference, kube.pending) == {}
    # Neither scheduler leaves behind what the other places, beyond the order-dependent few.
    assert len(ours.placed) >= len(kube.placed) - max(3, math.ceil(0.03 * PODS))
