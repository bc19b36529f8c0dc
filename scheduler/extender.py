"""`kubegpu extender`: kube-scheduler's HTTP extender protocol in front of the same engine and plugins.

Many clusters (EKS among them) cannot replace the default scheduler; kube-scheduler can still delegate device
decisions to an extender (`urlPrefix` `http(s)://HOST:PORT`, verbs `filter`, `prioritize`, `bind`, `preempt`). The
extender is wired from the parts it shares with the custom scheduler: the cluster mirror (`mirror.py`, the same
informers into the same engine, so `nodeCacheCapable: true` works; a full `Nodes` list works too), the binder
(`binder.py`) and the health and metrics routes (`health.py`). kube-scheduler queues the pods; the extender only
remembers the pending ones (`UnboundPods`), so that its verbs need no GET.

* `/filter` (ExtenderArgs -> ExtenderFilterResult): the engine's filter over the candidate nodes
  (`Engine.filter_nodes`); nodes that devices in use block go to `FailedNodes`, nodes that can never take the pod (a
  trn1 asked for 7 devices) to `FailedAndUnresolvableNodes`; kube-scheduler puts these messages in its
  FailedScheduling event.
* `/prioritize` (ExtenderArgs -> HostPriorityList): the engine's score (plugin topology score plus binpack/spread)
  scaled to kube-scheduler's 0..10; hosts scoring 0 are left out of the list (kube-scheduler counts them as 0).

  Both remember their answers node by node for each pod shape; between two calls only the nodes the engine reports
  as changed (usually just the one the last pod was bound to) are asked again.
* `/bind` (ExtenderBindingArgs -> ExtenderBindingResult): re-checks the fit and reserves the devices atomically
  under the engine lock, then creates the Binding carrying the signed `kubegpu.io/allocation` and plugin
  annotations in its metadata (the API server copies them onto the pod in the same write, guarded by the pod's
  UID), and rolls the reservation back on any failure.
* `/preempt` (ExtenderPreemptionArgs -> ExtenderPreemptionResult): keeps only candidate nodes where evicting the
  proposed victims, or else the engine's own choice in their place (`Engine.complete_victims`), frees a valid device
  set. A victim's gang is kept whole: the rest of it on that node is named too, and nodes whose victims cut no gang
  below its `minMember` are preferred; the rest of a gang cut on other nodes is evicted once kube-scheduler's choice
  is seen (`gangcuts.py`). A pending pod kube-scheduler nominated (`status.nominatedNodeName`) has its node held
  in the engine (`Engine.nominate`), so `/filter` keeps pods of equal or lower priority off the room its victims
  free: kube-scheduler's own filters count the nominated pod, but not the `ignoredByScheduler` GPU shares.
* `GET /apis/kubegpu/v1/nodes` and `/apis/kubegpu/v1/pods` (`?watch=true` streams changes as JSON lines): each node's
  devices and who holds them. Each view is brought up to date once per engine change and shared by every watcher. A
  pod held by count (bound without a verified allocation) is shown as `compat.py` shows it: `byCount`, a null id per
  device, and on its node no holder of any particular device but a count under `heldByCount`.

Only the informers add nodes: a node a caller names that kubegpu does not know fails with a reason, and is never
added to the engine or remembered. Callers authenticate with a client certificate (kube-scheduler's extender
`tlsConfig`); without `--client-ca` the server refuses to start unless told `--insecure-no-client-auth`. Only the
probes (`/healthz`, `/readyz`) and `/metrics` answer a client without one. The HTTP server (`http_server.py`) bounds
what any client may hold: sizes, timeouts, a body budget, connections, and unread answers.

Until the informers have listed the nodes and the pods (`/readyz`), the verbs give nothing: `/filter` and `/bind`
answer an Error saying so, `/prioritize` scores no host, `/preempt` offers no node.

Bad input never takes the server down: malformed JSON, a body of the wrong shape or over the size limit get a 4xx
with a JSON message naming the problem; a pod the protocol can answer about (an unknown node, an invalid quantity)
gets a 200 whose `Error` explains, where the protocol has that field.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httptools
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubegpu.core.errors import InputError, describe_validation_error
from kubegpu.core.manifests import ManifestError, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import add_verify_key_argument, configure_logging, read_key, read_verify_keys
from kubegpu.core.status import Code
from kubegpu.kube.client import ApiError, AsyncKubeClient, KubeClient
from kubegpu.plugins.intel_gas.scheduler import WITHOUT_I915_ENV
from kubegpu.scheduler import compat, liveness
from kubegpu.scheduler.binder import Binder, add_disruption_conditions_argument, marks_victims
from kubegpu.scheduler.engine import POLICIES, Decision, Engine, Placement, Plan
from kubegpu.scheduler.gangcuts import GangCuts
from kubegpu.scheduler.gangplans import GangPlan, GangPlans
from kubegpu.scheduler.gates import gated_reason
from kubegpu.scheduler.health import HEALTH_PATHS, Metrics, answer_health
from kubegpu.scheduler.http_server import Answer, HttpServer, Limits, tls_context
from kubegpu.scheduler.mirror import ClusterMirror
from kubegpu.scheduler.podgroups import PodGroup, gang_key
from kubegpu.scheduler.preemption import added_violations

__all__ = ["ExtenderHttpServer", "ExtenderServer", "UnboundPods", "add_extender_parser"]

log = logging.getLogger("kubegpu.extender")

MAX_EXTENDER_PRIORITY = 10
DEFAULT_LISTEN = "0.0.0.0:8888"
MAX_ENGINE_SCORE = 200.0


# -- protocol bodies (kube-scheduler sends Go field names, without JSON tags) ------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _NodeList(_Body):
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Body):
    Pod: dict[str, Any]
    Nodes: _NodeList | None = None
    NodeNames: list[str] | None = None


class BindingArgs(_Body):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = ""
    Node: str = Field(min_length=1)


class _MetaPod(_Body):
    UID: str


class _MetaVictims(_Body):
    Pods: list[_MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class _Victims(_Body):
    Pods: list[dict[str, Any]] = Field(default_factory=list)
    NumPDBViolations: int = 0


class PreemptionArgs(_Body):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, _Victims] | None = None
    NodeNameToMetaVictims: dict[str, _MetaVictims] | None = None


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _parse(model: type[_Body], body: bytes) -> Any:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest(400, f"the body must be a JSON object ({model.__name__}), not {type(document).__name__}")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise BadRequest(400, describe_validation_error(exc, model.__name__)) from None


@dataclass(slots=True)
class _Answers:
    """The filter and score answers for one pod shape (one plan signature), node by node, as of engine change
    `generation`. kube-scheduler asks about the same few hundred nodes for every replica of a workload, and between
    two of its calls only the node it bound changed: the engine names the changed nodes, and only they are redone.
    The answers are kept as sets so that a call over hundreds of names costs a few set operations."""

    generation: int
    passing: set[str] = field(default_factory=set)
    failing: dict[str, str] = field(default_factory=dict)  # the reason, for nodes that do not pass
    unresolvable: set[str] = field(default_factory=set)
    scored: dict[str, orjson.Fragment] = field(default_factory=dict)  # encoded HostPriority, for scores above 0
    unscored: set[str] = field(default_factory=set)  # nodes known to score 0

    def forget(self, names: set[str]) -> None:
        self.passing -= names
        self.unresolvable -= names
        self.unscored -= names
        for name in names & self.failing.keys():
            del self.failing[name]
        for name in names & self.scored.keys():
            del self.scored[name]


MAX_SHAPES = 256  # pod shapes whose answers are kept
UNKNOWN_NODE = "node(s) unknown to kubegpu (not in its node cache yet)"
GANG_ELSEWHERE = "node(s) outside the place kubegpu found for the whole gang"


def _node_name(item: Any) -> str | None:
    meta = item.get("metadata") if isinstance(item, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else None


class UnboundPods:
    """The pods that wait for a node, as the informer last reported them, with their resourceVersion: kube-scheduler
    queues them and names them in its calls, and the extender reads them from here instead of parsing or fetching
    them again. The mirror's `PendingPods` for the extender.

    Per gang with waiting members: their keys, and the number of the last change among them (`epoch`: a member
    added, updated or gone; numbered across gangs, so that a gang that empties and fills again never repeats one)
    that its plan (`gangplans`) is checked against. A member the extender bound (`bound`) leaves without a change:
    its gang's plan followed the binding already. `gone` is told of a gang whose last waiting member left.

    Everything kept is of the pods waiting here (`_bound` is a subset of `pods`' keys), so the informer's relist
    (`keep_only`) bounds it all: a key kept apart from its pod would stay when no event of the pod ever comes."""

    def __init__(self, gone: Callable[[str], None] = lambda gang: None) -> None:
        self.gone = gone
        self.pods: dict[str, tuple[str, PodRequest]] = {}
        self.gangs: dict[str, dict[str, None]] = {}
        self.epochs: dict[str, int] = {}
        self._changes = 0
        self._bound: set[str] = set()

    def get(self, key: str) -> tuple[str, PodRequest] | None:
        return self.pods.get(key)

    def members(self, gang: str) -> dict[str, PodRequest]:
        """The gang's waiting members, by key."""
        return {key: self.pods[key][1] for key in self.gangs.get(gang, ())}

    def epoch(self, gang: str) -> int:
        return self.epochs.get(gang, 0)

    def bound(self, pod: PodRequest, bound: bool = True) -> None:
        """The extender bound the member `pod` (its gang's plan followed), or the binding failed (`bound` False).

        Only a member waiting here is marked. One the informer has not reported (the bind verb read it from the API
        server) has no waiting entry whose leaving could be a change, and its first report unmarks it anyway
        (`observe` and `drop` replace what was known of the key); marked, it stayed for good if that report never
        came (deleted at once, and the watch relisted past it)."""
        known = self.pods.get(pod.key)
        if bound and known is not None and known[1].uid == pod.uid:
            self._bound.add(pod.key)
        else:
            self._bound.discard(pod.key)

    def observe(self, key: str, request: PodRequest, version: str, *, deleting: bool, held: bool) -> bool:
        if deleting:
            self.drop(key)
            return False
        known = self.pods.get(key)
        if known is not None and known[0] == version and known[1] == request:
            return True  # a relist's report of what is known: no change
        self.drop(key)
        self.pods[key] = (version, request)
        gang = gang_key(request)
        if gang is not None:
            self.gangs.setdefault(gang, {})[key] = None
            self._changed(gang)
        return True

    def binding(self, key: str) -> str | None:
        return None  # the bind verb reserves in the engine; the engine's record of the pod settles its events

    def drop(self, key: str) -> None:
        known = self.pods.pop(key, None)
        followed = key in self._bound
        self._bound.discard(key)
        gang = gang_key(known[1]) if known is not None else None
        if gang is None:
            return
        members = self.gangs.get(gang, {})
        members.pop(key, None)
        if not members:  # nothing of the gang is kept once none of its members waits, its plan neither
            self.gangs.pop(gang, None)
            self.epochs.pop(gang, None)
            self.gone(gang)
        elif not followed:
            self._changed(gang)

    def _changed(self, gang: str) -> None:
        self._changes += 1
        self.epochs[gang] = self._changes

    def keep_only(self, live: set[str]) -> None:
        for key in [k for k in self.pods if k not in live]:
            self.drop(key)

    def wake(self) -> None:
        return None  # kube-scheduler's queue retries its pods on the cluster's events

    def wake_for(self, added: PodRequest) -> None:
        return None

    def wake_group(self, key: str) -> None:
        return None

    def answers_for(self, scheduler_name: object) -> bool:
        return False  # kube-scheduler tells its pods why it cannot schedule them


class ExtenderServer:
    """The protocol logic, independent of the HTTP server that carries it: the cluster mirror, the binder and the
    extender's remembered answers around one engine."""

    def __init__(
        self,
        engine: Engine,
        client: KubeClient,
        writer: AsyncKubeClient,
        *,
        policy: str | None = None,
        leases: liveness.NodeLeases | None = None,
        disruption_conditions: str = "auto",
    ) -> None:
        self.engine = engine
        self.metrics = Metrics()
        marks = marks_victims(disruption_conditions, lambda: self.mirror.server_version)
        self.binder = Binder(writer, self.metrics, component="", marks=marks)
        self.gang_plans = GangPlans()  # the gangs' what-if placements their members are answered from
        self.unbound = UnboundPods(self.gang_plans.drop)
        self._listed = False  # every informer has listed its collection (`not_ready`)
        self.mirror = ClusterMirror(
            client,
            engine,
            self.binder,
            self.unbound,
            leases=leases,
            watch_budgets=True,  # `/preempt` counts the budgets the rest of a victim's gang violates
            watch_podgroups=True,
            follow_nominations=True,
            bound_leaving=lambda pod, node, gone, preempted: self.gang_cuts.leaving(pod, node, gone, preempted),
            nominated=lambda pod, node: self.gang_cuts.nominated(pod, node),
        )
        self.metrics.count_pods_on_verify_keys(self.mirror.pods_on_verify_keys)
        # The rest of a gang kube-scheduler's preemption cut below its minMember is evicted (`gangcuts.py`).
        self.gang_cuts = GangCuts(
            engine, self.binder, self._waiting_members, self.mirror.lock, server=lambda: self.mirror.server_version
        )
        # The score /prioritize answers with: the engine's (its binpack or spread policy plus the plugins' topology
        # score), or nvidia-gpu-scheduler's (`compat.FREE_MODEL_GPUS`: free GPUs of the pod's model).
        self.free_model_gpus = policy == compat.FREE_MODEL_GPUS
        self._answers: dict[tuple[object, ...], _Answers] = {}
        self._swept = self.engine.generation  # nodes removed up to this change are forgotten by every shape
        self._placing: set[asyncio.Task[str]] = set()  # bindings being written, whoever still waits for them

    def _waiting_members(self, gang: str) -> int:
        """The gang's members waiting to be bound that count towards its minMember (not gated; `UnboundPods` keeps
        a member the extender bound until the informer reports it gone)."""
        members = self.unbound.members(gang).items()
        return sum(1 for key, pod in members if self.engine.placement(key) is None and not pod.scheduling_gates)

    def _pod(self, document: dict[str, Any]) -> PodRequest:
        """The pod kube-scheduler asks about: the informer's parse of it when UID and resourceVersion match (filter and
        prioritize ask about a pending pod the informer has already read), else parsed from the document."""
        meta = document.get("metadata")
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            known = self.unbound.get(f"{meta.get('namespace', 'default')}/{meta.get('name')}")
            if known is not None and known[0] == str(meta["resourceVersion"]) and known[1].uid == meta.get("uid"):
                return known[1]
        try:
            request, _ = pod_request(document, self.engine.plugins.qualifiers)
        except InputError as exc:
            raise _PodError(str(exc)) from None
        return request

    @staticmethod
    def _candidates(args: ExtenderArgs) -> list[str]:
        """The node names asked about. A full `Nodes` list is read for its names only: the nodes themselves come from
        kubegpu's informer, never from a caller (who could otherwise invent nodes, and bind to them)."""
        if args.NodeNames is not None:
            return args.NodeNames
        return [name for item in (args.Nodes.items if args.Nodes else []) if (name := _node_name(item))]

    def _sweep(self) -> None:
        """Forget removed nodes in every shape's answers, so that they only ever name nodes the engine knows (a shape
        not asked about again would otherwise keep them until it is evicted)."""
        changed = self.engine.changed_since(self._swept)
        self._swept = self.engine.generation
        if changed is None:
            self._answers.clear()
            return
        gone = changed - self.engine.node_names()
        if gone:
            for answers in self._answers.values():
                answers.forget(gone)

    def _answered(self, pod: PodRequest, plan: Plan, wanted: set[str]) -> _Answers:
        """The pod shape's answers, with every node of `wanted` (names the engine knows) decided (call with the
        mirror's lock held)."""
        if self._swept != self.engine.generation:
            self._sweep()
        # A node held for a preempting pod (`Engine.nominate`) refuses the pods of its shape and priority but passes
        # that pod itself: the nominee's answers are its own, or it was refused its own node after a twin's call.
        shape = plan.signature if self.engine.nominated_node(pod.key) is None else (*plan.signature, pod.key)
        answers = self._answers.pop(shape, None)  # re-inserted last: the dict is kept in LRU order
        if answers is not None:
            changed = self.engine.changed_since(answers.generation)
            if changed is None:
                answers = None
            else:
                answers.forget(changed)
        if answers is None:
            answers = _Answers(self.engine.generation)
            if len(self._answers) >= MAX_SHAPES:
                del self._answers[next(iter(self._answers))]
        answers.generation = self.engine.generation
        self._answers[shape] = answers
        undecided = wanted - answers.passing - answers.failing.keys()
        for name, status in self.engine.filter_nodes(pod, undecided, plan).items():
            if status.ok:
                answers.passing.add(name)
            else:
                answers.failing[name] = status.message
                if status.code is Code.UNRESOLVABLE:
                    answers.unresolvable.add(name)
        return answers

    def not_ready(self) -> str | None:
        """Why the verbs cannot be answered yet (None once every informer has listed): until the pods are listed, the
        ledger does not know which devices are held, and a bind would give them again. A restarted extender listens
        at once, and kube-scheduler can reach it before the kubelet's readiness probe takes it out of its Service
        (the same pod IP, or a direct `urlPrefix`). A mirror that runs no informers (fed directly, as an embedder or a
        test feeds it) is taken as it is."""
        if self._listed or self.mirror.surveyed is None:
            return None
        waiting = self.mirror.syncing()
        if waiting:
            return f"kubegpu extender is still listing the cluster ({', '.join(waiting)}); try again shortly"
        self._listed = True  # informers never unlist
        return None

    def filter(self, body: bytes) -> dict[str, Any]:
        args: ExtenderArgs = _parse(ExtenderArgs, body)
        if (problem := self.not_ready()) is not None:
            return {"NodeNames": None, "Nodes": None, "FailedNodes": {}, "Error": problem}
        try:
            pod = self._pod(args.Pod)
        except _PodError as exc:
            return {"NodeNames": None, "Nodes": None, "FailedNodes": {}, "Error": f"invalid pod: {exc}"}
        names = self._candidates(args)
        wanted = set(names)
        with self.mirror.lock:
            refused = self.engine.validate_devices(pod)
            if not refused.ok:  # PreFilter: no node can take the pod, whatever each node's own filters would say
                failed = dict.fromkeys(names, refused.message)
                if log.isEnabledFor(logging.INFO):
                    log.info("filter", extra={"pod": pod.key, "passed": "", "failed": _refusals(failed)})
                return self._filter_result(args, [], failed, failed if refused.code is Code.UNRESOLVABLE else {})
            unknown = wanted - self.engine.node_names()
            answers = self._answered(pod, self.engine.plan(pod), wanted - unknown if unknown else wanted)
            failing = answers.failing
            gang = self._gang_nodes(pod) if gang_key(pod) is not None else None
            if isinstance(gang, str):  # a gang member whose gang cannot be placed whole: no node
                failing = {**dict.fromkeys(names, gang), **failing}
            elif gang is not None:  # only the nodes its gang's whole placement names
                failing = {**{n: GANG_ELSEWHERE for n in names if n not in gang}, **failing}
            if not unknown and failing.keys().isdisjoint(wanted):
                passed, failed = names, {}  # the usual case: every candidate passes
            else:
                passed = [name for name in names if name not in failing and name not in unknown]
                failed = {
                    name: UNKNOWN_NODE if name in unknown else failing[name]
                    for name in names
                    if name in unknown or name in failing
                }
            unresolvable = {
                name: reason for name, reason in failed.items() if name in unknown or name in answers.unresolvable
            }
        if log.isEnabledFor(logging.INFO):
            log.info("filter", extra={"pod": pod.key, "passed": _names(passed), "failed": _refusals(failed)})
        return self._filter_result(args, passed, failed, unresolvable)

    @staticmethod
    def _filter_result(
        args: ExtenderArgs, passed: list[str], failed: dict[str, str], unresolvable: dict[str, str]
    ) -> dict[str, Any]:
        """The ExtenderFilterResult, in the form the caller asked in (`NodeNames`, or a `Nodes` list)."""
        # Unresolvable nodes are listed in FailedNodes too: schedulers before 1.21 read only FailedNodes; newer ones
        # let FailedAndUnresolvableNodes take precedence and skip preemption there.
        result: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if args.NodeNames is not None:
            result["NodeNames"] = passed
        else:
            keep = set(passed)
            items = [n for n in (args.Nodes.items if args.Nodes else []) if _node_name(n) in keep]
            result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}
        return result

    def _gang_nodes(self, pod: PodRequest) -> str | Collection[str] | None:
        """For a gang member: the nodes its gang's whole placement would use (a what-if: `place_gang` for the gang's
        unbound members, given back at once, kept as the gang's plan while it holds: `gangplans`), or why the gang
        cannot be placed whole, so that every member gets the same answer; None for a pod of no gang. kube-scheduler
        binds members one by one, so none is let through before `minMember` members exist (docs/gangs.md: what
        holds in extender mode)."""
        engine = self.engine
        try:
            group = engine.gang_of(pod)
        except ManifestError as exc:
            return str(exc)
        problem = self.mirror.podgroups.get(gang_key(pod) or "")
        if isinstance(problem, str):
            return problem
        if group is None:
            return None
        if pod.scheduling_gates:  # not schedulable yet (kube-scheduler asks about it only before 1.26)
            return f"gang {group.key}: this member is not schedulable yet: {gated_reason(pod.scheduling_gates)}"
        epoch = self.unbound.epoch(group.key)
        stamp = engine.plan(pod).stamp
        namespaces = engine.namespace_epoch
        plan = self.gang_plans.get(group.key, group, engine.generation, epoch, stamp, engine.changed_since, namespaces)
        if plan is None or pod.key not in plan.waiting:
            members = self.unbound.members(group.key)
            members[pod.key] = pod  # as kube-scheduler asks it: ungated, though the informer may not have said so
            # A gated member is not schedulable yet: kube-scheduler keeps it out of its queue, and coscheduling
            # and Kueue do not count it towards minMember (nor does the custom scheduler: `enqueue.SchedulingGates`).
            todo = [r for key, r in members.items() if engine.placement(key) is None and not r.scheduling_gates]
            present = len(engine.gang_holders(group)) + len(todo)
            if present < group.min_member:
                gated = sum(1 for request in members.values() if request.scheduling_gates)
                waits = f" ({gated} more wait for their scheduling gates)" if gated > 1 else ""
                waits = " (1 more waits for its scheduling gates)" if gated == 1 else waits
                return (
                    f"gang {group.key}: {present} of minMember {group.min_member} members exist{waits}; "
                    "kube-scheduler binds members one by one, so none goes before all have places"
                )
            if not todo:
                return None
            plan = self._plan_gang(group, todo, epoch)
        return plan.answer if plan.answer is not None else plan.on_node.keys()

    def _plan_gang(self, group: PodGroup, todo: list[PodRequest], epoch: int) -> GangPlan:
        """Place the gang's unbound members (a what-if, given back at once) and keep the answer as its plan."""
        engine = self.engine
        placement = engine.place_gang(todo, group)
        reserved = {request.key: request for request in todo}
        plan = GangPlan(group, engine.generation, epoch, set(reserved), namespaces=engine.namespace_epoch)
        if not placement.placed:
            plan.answer = placement.reason or f"gang {group.key} cannot be placed whole"
        for decision in placement.decisions:
            if decision.scheduled and decision.node is not None and decision.pod in reserved:
                request = reserved[decision.pod]
                plan.place(decision.pod, decision.node, engine.plan(request).signature)
                engine.unreserve(request, decision.node)
        plan.generation = engine.generation  # the what-if given back
        # What lets the plan hold across other nodes' changes (`GangPlan.catch_up`): one stamp for every member
        # whose answers depend on its own node alone, and the nodes where the gang's members hold places.
        plans = [engine.plan(request) for request in todo]
        stamps = {member.stamp for member in plans}
        if len(stamps) == 1 and not any(member.volatile for member in plans):
            plan.stamp = stamps.pop()
            holders = (engine.placement(key) for key in engine.gang_holders(group))
            plan.held_on = {held.node for held in holders if held is not None}
        self.gang_plans.keep(group.key, plan)
        return plan

    def prioritize(self, body: bytes) -> list[orjson.Fragment]:
        """Hosts that score 0 are left out: kube-scheduler counts a host missing from the list as 0, and with binpack
        every empty node scores 0, so the list names just the partly used nodes instead of every candidate."""
        args: ExtenderArgs = _parse(ExtenderArgs, body)
        if self.not_ready() is not None:  # every host scores 0; its /filter said why
            return []
        try:
            pod = self._pod(args.Pod)
        except _PodError as exc:
            raise BadRequest(422, f"invalid pod: {exc}") from None
        candidates = set(self._candidates(args))
        with self.mirror.lock:
            wanted = candidates & self.engine.node_names()  # an unknown node is not scored (kube-scheduler: 0)
            plan = self.engine.plan(pod)
            answers = self._answered(pod, plan, wanted)
            scored = answers.scored
            epochs = None  # the fragmentation epochs, asked once for every node scored below
            for name in wanted - scored.keys() - answers.unscored:
                score = 0
                if name in answers.passing and self.free_model_gpus:
                    score = min(MAX_EXTENDER_PRIORITY, compat.free_model_gpus(self.engine, name, pod))
                elif name in answers.passing:
                    if epochs is None:
                        epochs = self.engine.score_epochs(plan)
                    raw = self.engine.score_node(name, pod, plan, epochs=epochs)
                    score = round(MAX_EXTENDER_PRIORITY * min(raw, MAX_ENGINE_SCORE) / MAX_ENGINE_SCORE)
                if score:
                    scored[name] = orjson.Fragment(orjson.dumps({"Host": name, "Score": score}))
                else:
                    answers.unscored.add(name)
            return [scored[name] for name in sorted(wanted & scored.keys())]

    async def _pending(self, key: str, uid: str) -> tuple[str, PodRequest]:
        """The pod to bind and its resourceVersion: from the informer's cache, else from the API server."""
        with self.mirror.lock:
            cached = self.unbound.get(key)
        if cached is not None and (not uid or cached[1].uid == uid):
            return cached
        namespace, name = key.split("/", 1)
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        obj = await self.binder.on_writer(self.binder.writer.request("GET", path))
        if uid and (obj.get("metadata") or {}).get("uid") != uid:
            raise _PodError(f"it has another UID than the one to bind ({uid}); it was recreated")
        return str((obj.get("metadata") or {}).get("resourceVersion", "")), self._pod(obj)

    async def bind(self, body: bytes) -> dict[str, Any]:
        """Reserve, then write the Binding. The write and its rollback run as their own task: a caller that hangs up
        (kube-scheduler's timeout) cancels its wait, never a write half done nor the rollback after it."""
        args: BindingArgs = _parse(BindingArgs, body)
        key = f"{args.PodNamespace}/{args.PodName}"
        if (problem := self.not_ready()) is not None:
            return {"Error": f"pod {key}: {problem}"}
        try:
            _, pod = await self._pending(key, args.PodUID)
        except (ApiError, _PodError) as exc:
            return {"Error": f"pod {key}: {exc}"}
        with self.mirror.lock:
            held = self.engine.placement(key)
            if held is not None and held.request.uid == pod.uid:
                if held.node == args.Node:
                    return {"Error": ""}  # already bound here (a retried bind)
                return {"Error": f"pod {key} already holds devices on {held.node}"}
            if args.Node not in self.engine.node_names():
                return {"Error": f"node {args.Node} is unknown to kubegpu"}
            before = self.engine.generation
            gang = gang_key(pod)
            if gang is not None:  # other nodes' changes since its /filter leave its gang's plan as it was
                self.gang_plans.catch_up(gang, before, self.engine.plan(pod).stamp, self.engine.changed_since)
            decision = self.engine.reserve(pod, args.Node)
            gang = gang if decision.scheduled else None
            if gang is not None and self.gang_plans.bound(gang, pod, args.Node, before, self.engine.generation):
                self.unbound.bound(pod)
        if not decision.scheduled:
            return {"Error": f"pod {key} no longer fits node {args.Node}: {decision.reason}"}
        task = asyncio.get_running_loop().create_task(self._place(key, pod, decision))
        self._placing.add(task)
        task.add_done_callback(self._placing.discard)
        return {"Error": await asyncio.shield(task)}

    async def _place(self, key: str, pod: PodRequest, decision: Decision) -> str:
        """Write the Binding; on any failure roll the reservation back. Returns the error for kube-scheduler, or ""."""
        try:
            error = await self.binder.on_writer(self.binder.bind(pod, decision))
        except Exception as exc:  # the hand-over to the writer's loop failed (it is closing)
            error = ApiError(0, "ClientError", repr(exc))
            self.metrics.bind_errors.inc()
        if error is None:
            return ""
        with self.mirror.lock:
            self.unbound.bound(pod, False)  # still waiting: its leaving later is a change to its gang's plan
        self.mirror.roll_back(pod, decision.node, error)
        return f"binding {key} to {decision.node} failed: {error}"

    def preempt(self, body: bytes) -> dict[str, Any]:
        args: PreemptionArgs = _parse(PreemptionArgs, body)
        if self.not_ready() is not None:  # no victim can be judged: no node is offered
            return {"NodeNameToMetaVictims": {}}
        try:
            pod = self._pod(args.Pod)
        except _PodError as exc:
            raise BadRequest(422, f"invalid pod: {exc}") from None
        proposals: dict[str, tuple[list[str], int]] = {}
        if args.NodeNameToMetaVictims is not None:
            for node, meta in args.NodeNameToMetaVictims.items():
                proposals[node] = ([p.UID for p in meta.Pods], meta.NumPDBViolations)
        for node, victims in (args.NodeNameToVictims or {}).items():
            uids = [str((p.get("metadata") or {}).get("uid", "")) for p in victims.Pods]
            proposals[node] = (uids, victims.NumPDBViolations)
        kept: dict[str, Any] = {}
        cutting: dict[str, Any] = {}  # nodes whose victims leave a gang below its minMember on other nodes
        with self.mirror.lock:
            budgets = list(self.mirror.budgets.values())
            for node, (uids, violations) in proposals.items():
                # When kube-scheduler's victims do not free a valid device set, the engine's own choice
                # (DefaultPreemption's rules, devices included) replaces them, or the node is dropped: a proposed
                # pod the engine's choice does not need would be evicted for nothing.
                extra = self.engine.complete_victims(pod, node, uids, budgets)
                if extra is None:
                    continue
                if extra.victims:
                    uids = [p.uid for p in extra.victims]
                    violations = extra.violations
                held_victims = self._held(node, uids)
                # A victim's gang is kept whole, as the custom scheduler's preemption keeps it (T182): the rest of
                # a gang cut below its minMember goes too. kube-scheduler evicts only pods of the node it picks,
                # so the rest on this node is named here, and a node with some of it elsewhere is offered only
                # when every node is (the extender evicts that rest once kube-scheduler's choice is seen:
                # `GangCuts`). None: the gang has a member of the preemptor's priority or higher; it cannot go.
                whole = self.engine.whole_gangs(held_victims, pod.priority)
                if whole is None:
                    continue
                here = [m for m in whole if (held := self.engine.placement(m.key)) is not None and held.node == node]
                if here:
                    uids = [*uids, *(m.uid for m in here)]
                    violations += added_violations(held_victims, here, budgets)
                answer = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": violations}
                (cutting if len(here) < len(whole) else kept)[node] = answer
        if not kept and cutting:
            log.info(
                "preempt: every candidate's victims cut a gang below its minMember; its rest goes once one is chosen",
                extra={"pod": pod.key, "node": _names(sorted(cutting))},
            )
        return {"NodeNameToMetaVictims": kept or cutting}

    def _held(self, node: str, uids: list[str]) -> list[PodRequest]:
        """The pods of `uids` that hold resources on `node` (call with the mirror's lock held)."""
        wanted = set(uids)
        placed = (self.engine.placement(key) for key in self.engine.holders(node))
        return [held.request for held in placed if held is not None and held.request.uid in wanted]

    # -- the monitoring API -----------------------------------------------------------------------------------------

    def node_views(self, changed: set[str] | None) -> dict[str, dict[str, Any] | None]:
        """The monitoring objects of the nodes in `changed` (every node when None); None for a node that is gone or
        has no devices. Call with the mirror's lock held."""
        views: dict[str, dict[str, Any] | None] = {}
        for name in self.engine.node_names() if changed is None else changed:
            if not self.engine.has_devices(name):
                views[name] = None
                continue
            holders = self.engine.holders(name)
            by_count = {key for key in holders if (held := self.engine.placement(key)) is not None and held.by_count}
            counted: dict[str, int] = {}
            devices = [o.model_dump(mode="json") for o in self.engine.describe(name)]
            for cell in (cell for picture in devices for cell in picture["cells"]):
                for holder in cell["holders"]:
                    if holder in by_count:  # set aside by count: not this very device
                        counted[holder] = counted.get(holder, 0) + 1
                cell["holders"] = [h for h in cell["holders"] if h not in by_count]
                cell["shares"] = {h: part for h, part in cell["shares"].items() if h not in by_count}
            views[name] = {"name": name, "devices": devices, "pods": sorted(holders), "heldByCount": counted}
        return views

    def pod_views(self, changed: set[str] | None) -> dict[str, dict[str, Any] | None]:
        """The monitoring objects of the pods holding devices on the nodes in `changed` (every node when None). Call
        with the mirror's lock held."""
        keys = None if changed is None else [key for name in changed for key in self.engine.holders(name)]
        views: dict[str, dict[str, Any] | None] = {}
        for pod in self.engine.placements(keys):
            devices = _held_devices(pod)
            if not devices:
                continue
            key = pod.request.key
            views[key] = {
                "pod": key,
                "uid": pod.request.uid,
                "node": pod.node,
                "byCount": pod.by_count,
                "devices": devices,
            }
        return views


def _held_devices(pod: Placement) -> dict[str, dict[str, list[str | None]]]:
    """What the pod view says each container of `pod` holds (container -> resource -> device ids): its allocation's
    ids; for a pod held by count, a null per device (the kubelet chose them; the ledger's are a guess, as
    `compat.gpu_pod_views` says too); for a pod whose ids the node side published, exactly those."""
    if pod.allocation is not None and not pod.by_count:
        return {
            c: {r: list[str | None](ids) for r, ids in held.items()} for c, held in pod.allocation.containers.items()
        }
    devices: dict[str, dict[str, list[str | None]]] = {}
    for part in pod.parts.values():
        for container, resources in part.containers.items():
            for resource, ids in resources.items():
                held = devices.setdefault(container, {}).setdefault(resource, [])
                held.extend(None if pod.by_count else device for device in ids)
    return devices


class _PodError(Exception):
    pass


LOGGED_NAMES = 20  # node names a filter log line lists per group before counting the rest


def _names(names: list[str]) -> str:
    """`a,b,c` for a filter log line; past LOGGED_NAMES names, the rest as a count."""
    shown = ",".join(names[:LOGGED_NAMES])
    return shown if len(names) <= LOGGED_NAMES else f"{shown},... ({len(names) - LOGGED_NAMES} more)"


def _refusals(failed: dict[str, str]) -> str:
    """The refused nodes of a filter log line grouped by reason, most frequent first:
    `2 node(s) Insufficient nvidia.com/gpu [p3-0,p3-1]; 1 node(s) ... [trn1-0]`."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in failed.items():
        by_reason.setdefault(reason, []).append(name)
    groups = sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0]))
    return "; ".join(f"{len(names)} node(s) {reason} [{_names(names)}]" for reason, names in groups)


# -- the monitoring feeds ------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Change:
    """One batch of watch events; `next` resolves to the batch after it (None: the server is stopping)."""

    lines: bytes
    next: asyncio.Future[_Change | None]


def _event(kind: bytes, encoded: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (kind, encoded)


class _Feed:
    """One monitoring view (nodes or pods), brought up to date once per engine change and shared by every list and
    watch of it: an object is described and encoded once per change, whatever the number of watchers, and a watcher
    is sent only the objects that changed. Lives on the HTTP server's event loop.

    `views(changed)` describes the objects of the changed nodes (all of them for None); an object of a changed node
    that it no longer returns was deleted."""

    POLL = 0.5  # seconds between looks at the engine's change number while someone watches

    def __init__(
        self, mirror: ClusterMirror, views: Callable[[set[str] | None], dict[str, dict[str, Any] | None]]
    ) -> None:
        self.mirror = mirror
        self.engine = mirror.engine
        self.views = views
        self.objects: dict[str, tuple[str, bytes]] = {}  # key -> (its node, the encoded object)
        self.by_node: dict[str, set[str]] = {}
        self.generation = -1
        self.head: _Change | None = None
        self.watchers = 0
        self.poller: asyncio.Task[None] | None = None

    def refresh(self) -> None:
        """Catch up with the engine, and hand the events of what changed to the watchers."""
        if self.generation == self.engine.generation and self.generation >= 0:
            return
        with self.mirror.lock:
            changed = None if self.generation < 0 else self.engine.changed_since(self.generation)
            self.generation = self.engine.generation
            views = self.views(changed)
        stale = set(self.objects) if changed is None else {k for n in changed for k in self.by_node.get(n, ())}
        lines = []
        for key in stale - views.keys():
            lines.append(_event(b"DELETED", self._drop(key)))
        for key, view in views.items():
            if view is None:
                if key in self.objects:
                    lines.append(_event(b"DELETED", self._drop(key)))
                continue
            encoded = orjson.dumps(view)
            node = str(view.get("node") or view.get("name"))
            old = self.objects.get(key)
            if old is not None and old[1] == encoded:
                continue
            if old is not None and old[0] != node:
                self._drop(key)
            self.objects[key] = (node, encoded)
            self.by_node.setdefault(node, set()).add(key)
            lines.append(_event(b"ADDED" if old is None else b"MODIFIED", encoded))
        if lines and self.head is not None:
            self._publish(b"".join(lines))

    def _drop(self, key: str) -> bytes:
        node, encoded = self.objects.pop(key)
        keys = self.by_node.get(node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_node[node]
        return encoded

    def _publish(self, lines: bytes | None) -> None:
        assert self.head is not None
        change = None if lines is None else _Change(lines, asyncio.get_running_loop().create_future())
        self.head.next.set_result(change)
        self.head = change

    def items(self) -> list[orjson.Fragment]:
        self.refresh()
        return [orjson.Fragment(encoded) for _, encoded in self.objects.values()]

    async def watch(self) -> AsyncGenerator[bytes, None]:
        """The current objects as ADDED, then each change's events, as a Kubernetes watch streams them."""
        if self.head is None:
            self.head = _Change(b"", asyncio.get_running_loop().create_future())
        self.refresh()
        position: _Change | None = self.head
        self.watchers += 1
        if self.poller is None:
            self.poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            if self.objects:
                yield b"".join(_event(b"ADDED", encoded) for _, encoded in self.objects.values())
            while position is not None:
                position = await position.next
                if position is not None:
                    yield position.lines
        finally:
            self.watchers -= 1

    async def _poll(self) -> None:
        try:
            while self.watchers and not self.mirror.stop.is_set():
                await asyncio.sleep(self.POLL)
                self.refresh()
            if self.mirror.stop.is_set() and self.head is not None:
                self._publish(None)  # every watch ends
        finally:
            self.poller = None
            if self.head is not None and not self.watchers:
                self.head = None  # nobody waits on the chain; a new watcher starts a fresh one


# The verbs asked while the extender still lists the cluster wait for the lists (polled every LISTING_POLL) until
# LISTING_WAIT after the first of them, then are answered as not ready: below kube-scheduler's default extender
# timeout (5 s), the shipped `httpTimeout`. One wait per process: lists that take longer are not about to arrive.
LISTING_WAIT = 2.0
LISTING_POLL = 0.05
OPEN_PATHS = HEALTH_PATHS  # the kubelet's probes and a metrics scraper carry no client certificate; none names a pod


class ExtenderHttpServer(HttpServer):
    """The extender's routes on kubegpu's HTTP server (see `http_server.py` for its limits).

    With `client_auth`, every path but the probes and `/metrics` needs a verified client certificate (401 without
    one): binding pods, and the monitoring API, which names every namespace's pods and their UIDs."""

    def __init__(
        self,
        server: ExtenderServer,
        listen: str,
        tls: ssl.SSLContext | None,
        loop: asyncio.AbstractEventLoop | None = None,
        limits: Limits | None = None,
        *,
        client_auth: bool | None = None,
    ) -> None:
        self.server = server
        self.client_auth = tls is not None and tls.verify_mode != ssl.CERT_NONE if client_auth is None else client_auth
        self.verbs: dict[str, Callable[[bytes], Any]] = {
            "filter": server.filter,
            "prioritize": server.prioritize,
            "preempt": server.preempt,
        }
        engine, mirror = server.engine, server.mirror
        self.feeds = {
            "/apis/kubegpu/v1/nodes": _Feed(mirror, server.node_views),
            "/apis/kubegpu/v1/pods": _Feed(mirror, server.pod_views),
            compat.GPUNODES: _Feed(mirror, lambda changed: compat.gpu_node_views(engine, changed)),
            compat.GPUPODS: _Feed(mirror, lambda changed: compat.gpu_pod_views(engine, changed)),
        }
        # The one wait for the first lists that every verb asked meanwhile shares (None: no verb has waited yet)
        self._lists: asyncio.Task[None] | None = None
        super().__init__(self.answer, listen, tls, loop, limits)

    def answer(self, method: bytes, target: bytes, body: bytes, caller: str | None) -> Answer:
        """A request's status and JSON document; for the answers that wait, a coroutine (bind) or a stream (watch)."""
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            return 400, {"error": f"invalid request target {target[:200].decode(errors='replace')!r}"}
        path = url.path.decode(errors="replace").rstrip("/") or "/"
        if self.client_auth and caller is None and not (method == b"GET" and path in OPEN_PATHS):
            return 401, {"error": "a client certificate signed by the extender's --client-ca is required"}
        if method == b"POST":
            verb = path.rsplit("/", 1)[-1]
            if verb == "bind":
                return self._bind(body)
            handler = self.verbs.get(verb)
            if handler is None:
                return 404, {"error": f"unknown verb {verb!r}; use filter, prioritize, bind or preempt"}
            if self.server.not_ready() is not None:
                return self._after_listing(verb, handler, body)
            return self._call(verb, handler, body)
        if method != b"GET":
            return 405, {"error": f"method {method.decode(errors='replace')} is not allowed; use POST or GET"}
        health = answer_health(path, self.server.mirror, self.server.metrics)
        if health is not None:
            return health
        if path == compat.PREFIX:  # the aggregation layer's discovery (examples/deploy: the APIService)
            return 200, compat.DISCOVERY
        feed = self.feeds.get(path)
        if feed is None:
            return 404, {"error": f"unknown path {path!r}"}
        query = parse_qs((url.query or b"").decode(errors="replace"))
        if query.get("watch", ["false"])[-1].lower() in ("true", "1"):
            return feed.watch()
        return 200, {"items": feed.items()}

    def shutdown(self) -> None:
        async def stop_feeds() -> None:
            for feed in self.feeds.values():
                if feed.poller is not None:
                    feed.poller.cancel()
            if self._lists is not None:
                self._lists.cancel()

        asyncio.run_coroutine_threadsafe(stop_feeds(), self.loop).result(timeout=10)
        super().shutdown()

    @staticmethod
    def _call(verb: str, handler: Callable[[bytes], Any], body: bytes) -> tuple[int, Any]:
        try:
            return 200, handler(body)
        except Exception as exc:
            return ExtenderHttpServer._failed(verb, exc)

    async def _after_listing(self, verb: str, handler: Callable[[bytes], Any], body: bytes) -> tuple[int, Any]:
        """A verb asked of an extender still listing the cluster, answered once the lists are in, or as not ready
        once the wait has run out. kube-scheduler 1.20 parks a pod whose extender answered an error with the
        unschedulable ones for 60 s, later versions for up to 5 minutes, unless a cluster event moves it: a pod asked
        about in a new extender's first second would otherwise wait that long."""
        await self._wait_for_lists()
        return self._call(verb, handler, body)

    async def _wait_for_lists(self) -> None:
        """Wait for the first lists, up to LISTING_WAIT after the first verb that waited for them. kube-scheduler
        asks about one pod at a time: were each verb to wait LISTING_WAIT, lists that never come (an informer whose
        list is refused) would hold every pod of the cluster behind each GPU pod's wait. One poller for all the
        verbs waiting, however many connections ask."""
        if self.server.not_ready() is None:
            return
        if self._lists is None:
            self._lists = self.loop.create_task(self._poll_lists(self.loop.time() + LISTING_WAIT))
        await asyncio.shield(self._lists)  # a client that leaves cancels its own wait, not the others'

    async def _poll_lists(self, deadline: float) -> None:
        while self.server.not_ready() is not None and self.loop.time() < deadline:
            await asyncio.sleep(LISTING_POLL)

    async def _bind(self, body: bytes) -> tuple[int, Any]:
        await self._wait_for_lists()
        try:
            return 200, await self.server.bind(body)
        except Exception as exc:
            return self._failed("bind", exc)

    @staticmethod
    def _failed(verb: str, exc: Exception) -> tuple[int, Any]:
        """A verb's exception as an answer: a 4xx with a JSON message, never a 5xx or a traceback."""
        if isinstance(exc, BadRequest):
            return exc.status, {"error": str(exc)}
        log.exception("%s failed", verb)
        return 400, {"error": f"could not process the request: {type(exc).__name__}: {exc}"}


def _gas_flags(args: argparse.Namespace) -> list[str]:
    """Apply GPU Aware Scheduling's flag names (`--port`, `--unsafe`, `--v`, `--enableAllowlist`, `--enableDenylist`,
    `--balancedResource`; `--cert`, `--key`, `--cacert`, `--kubeConfig`, `--qps`, `--burst` are plain aliases).
    Returns the warnings to log once logging is set up."""
    warnings = []
    if args.balanced_resource:
        raise SystemExit(
            f"kubegpu extender: GAS's --balancedResource={args.balanced_resource} (spreading containers over a node's "
            "cards by that resource) is not supported: kubegpu puts each container on the fullest cards that fit it, "
            "keeping whole cards free for large requests; remove the flag"
        )
    for flag, enabled, annotation in (
        ("--enableAllowlist", args.enable_allowlist, "gas-allow"),
        ("--enableDenylist", args.enable_denylist, "gas-deny"),
    ):
        if enabled is False:
            warnings.append(f"{flag}=false: kubegpu honours every pod's {annotation} annotation all the same")
    # klog's verbosity, as GAS's deployment passes it (`--v=4`): 5 and up are GAS's request dumps, debug here; the
    # filter decisions and binds GAS logs at 2 to 4 are logged at info.
    if args.klog_v is not None and args.klog_v >= 5 and args.log_level == "info":
        args.log_level = "debug"
    if args.port is not None:
        if args.listen is not None:
            raise SystemExit("kubegpu extender: give --listen or GAS's --port, not both")
        if not 0 < args.port < 65536:
            raise SystemExit(f"kubegpu extender: --port {args.port} is not a TCP port")
        args.listen = f"0.0.0.0:{args.port}"
    if args.listen is None:
        args.listen = DEFAULT_LISTEN
    if args.unsafe:
        ignored = [flag for flag, value in (("--cert", args.tls_cert), ("--key", args.tls_key),
                                            ("--cacert", args.client_ca)) if value]  # fmt: skip
        if ignored:
            warnings.append(f"--unsafe: serving plain HTTP, {', '.join(ignored)} ignored (as GAS does)")
        args.tls_cert = args.tls_key = args.client_ca = None
        args.insecure_no_client_auth = True
        warnings.append("--unsafe (GAS's flag) means --insecure-no-client-auth: plain HTTP, no client certificates")
    return warnings


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    for warning in _gas_flags(args):
        log.warning("%s", warning)
    if args.intel_without_i915:
        os.environ[WITHOUT_I915_ENV] = args.intel_without_i915  # read by the intel-gas plugin
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("kubegpu extender: --tls-cert and --tls-key go together")
    if args.client_ca and not args.tls_cert:
        raise SystemExit("kubegpu extender: --client-ca needs --tls-cert and --tls-key")
    if not args.client_ca and not args.insecure_no_client_auth:
        raise SystemExit(
            "kubegpu extender: refusing to serve without client authentication: whoever reaches the port could bind "
            "any pending pod to any node and list every pod. Pass --tls-cert, --tls-key and --client-ca (the CA of "
            "the client certificate in kube-scheduler's extender tlsConfig), or --insecure-no-client-auth to accept "
            "that"
        )
    if args.max_body_bytes < 1024:
        raise SystemExit("kubegpu extender: --max-body-bytes must be at least 1024")
    key = read_key(args.allocation_key_file)
    verify_keys = read_verify_keys(args.allocation_verify_key_file, key)
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        log.error("%s", failure)
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=32)
    engine = Engine(
        plugins,
        policy="binpack" if args.policy == compat.FREE_MODEL_GPUS else args.policy,
        signing_key=key,
        verify_keys=verify_keys,
    )
    extender = ExtenderServer(
        engine,
        client,
        writer,
        policy=args.policy,
        leases=liveness.from_args(args),
        disruption_conditions=args.disruption_conditions,
    )
    mirror = extender.mirror
    limits = Limits(max_body=args.max_body_bytes, body_budget=max(Limits.body_budget, 4 * args.max_body_bytes))
    tls = tls_context(args.tls_cert, args.tls_key, args.client_ca)
    httpd = ExtenderHttpServer(extender, args.listen, tls, writer.loop, limits, client_auth=bool(args.client_ca))
    scheme = "https" if args.tls_cert else "http"
    log.info("kubegpu extender serving on %s://%s:%d", scheme, *httpd.address)
    if not args.client_ca:
        log.warning(
            "--insecure-no-client-auth: callers are not authenticated; anyone who reaches %s://%s:%d can bind pending "
            "pods to nodes of their choice and read every pod's devices",
            scheme,
            *httpd.address,
        )

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        mirror.stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    mirror.start_informers()
    mirror.run()
    httpd.shutdown()
    writer.close()
    if mirror.refusal is not None:  # an API server older than kubegpu supports
        return 2
    return 0


def add_extender_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "extender",
        help="the HTTP scheduler-extender behind kube-scheduler",
        description="Serve kube-scheduler's extender protocol (filter, prioritize, bind, preempt) with kubegpu's "
        "engine and plugins, for clusters whose default scheduler cannot be replaced.",
    )
    parser.add_argument(
        "--kubeconfig", "--kubeConfig", "-kubeConfig", help="kubeconfig file (default: in-cluster service account)"
    )
    parser.add_argument("--listen", help=f"HOST:PORT to serve (default {DEFAULT_LISTEN})")
    parser.add_argument(
        "--allocation-key-file", required=True, help="HMAC key shared with the CRI shim: signs every allocation"
    )
    add_verify_key_argument(parser)
    parser.add_argument("--tls-cert", "--cert", "-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", "--key", "-key", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--client-ca",
        "--cacert",
        "-cacert",
        help="require client certificates signed by this CA (PEM, may hold several) for every path but /healthz "
        "and /readyz",
    )
    gas = parser.add_argument_group(
        "GPU Aware Scheduling (GAS) compatibility",
        "GAS's flag names work as written in its deployment (--cert, --key, --cacert and --kubeConfig are the "
        "aliases above; Go's single-dash spelling works too).",
    )
    gas.add_argument("--port", "-port", type=int, help="GAS's --port N: the same as --listen 0.0.0.0:N")
    gas.add_argument(
        "--unsafe",
        "-unsafe",
        nargs="?",
        const="true",
        default=False,
        type=_go_bool,
        help="GAS's --unsafe[=true]: plain HTTP without client authentication (implies --insecure-no-client-auth; "
        "--cert, --key and --cacert are then ignored)",
    )
    for flag, what in (("enableAllowlist", "gas-allow"), ("enableDenylist", "gas-deny")):
        gas.add_argument(
            f"--{flag}",
            f"-{flag}",
            dest=flag.replace("enable", "enable_").lower(),
            nargs="?",
            const="true",
            default=None,
            type=_go_bool,
            help=f"GAS's --{flag}[=true]: accepted; kubegpu always honours the {what} pod annotation",
        )
    gas.add_argument(
        "--balancedResource",
        "-balancedResource",
        dest="balanced_resource",
        default="",
        help="GAS's card balancing by a resource: refused unless empty (kubegpu fills the fullest cards)",
    )
    gas.add_argument(
        "--v",
        "-v",
        dest="klog_v",
        type=int,
        help="GAS's klog verbosity (--v=4): 5 or more means --log-level debug; filter decisions and binds are logged "
        "at info",
    )
    gas.add_argument(
        "--intel-without-i915",
        choices=["refuse", "ignore"],
        help="pods requesting gpu.intel.com/* without i915 or xe: refuse them (kubegpu's default) or, as GAS "
        "does, leave them to kube-scheduler's node totals (ignore)",
    )
    parser.add_argument(
        "--insecure-no-client-auth",
        action="store_true",
        help="serve without --client-ca: anyone who reaches the port may bind pods and read the monitoring API",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=Limits.max_body,
        help=f"largest request body (default {Limits.max_body}; full Nodes lists need more than node names)",
    )
    parser.add_argument(
        "--policy",
        choices=[*POLICIES, compat.FREE_MODEL_GPUS],
        default="binpack",
        help="node preference for /prioritize (default binpack); free-model-gpus: nvidia-gpu-scheduler's score, the "
        "free GPUs of the pod's nvidia-gpu-scheduler/gpu.model",
    )
    liveness.add_node_lease_options(parser)
    add_disruption_conditions_argument(parser)
    parser.add_argument(
        "--kube-api-qps",
        "--qps",
        "-qps",
        type=float,
        default=50.0,
        help="API requests a second (default 50; GAS's --qps)",
    )
    parser.add_argument(
        "--kube-api-burst",
        "--burst",
        "-burst",
        type=int,
        default=100,
        help="API request burst (default 100; GAS's --burst)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="info (default) logs every filter decision (nodes passed, nodes refused by reason) and every bind",
    )
    parser.set_defaults(func=run)
    return parser


def _go_bool(text: str) -> bool:
    """A Go flag's boolean value, as GAS's `--unsafe=true` is written."""
    value = text.strip().lower()
    if value in ("1", "t", "true"):
        return True
    if value in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true or false)")
