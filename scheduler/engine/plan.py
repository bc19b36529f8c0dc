"""The per-pod plan (kube-scheduler's PreFilter writing CycleState): a pod's requests grouped by owning
plugin, its signatures (what node answers may be shared by), its spread constraints (its own, or the defaults its
owners give it), and each owning plugin's prepared request. Also what the plan reads beyond the pod: claims and
volumes (`set_claim`, `set_volume`) and the owners that select pods (`set_owner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from operator import attrgetter

from kubegpu.core import dra
from kubegpu.core.models import (
    LabelSelector,
    NodeSelectorTerm,
    PodRequest,
    SpreadConstraint,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.core.status import Status
from kubegpu.scheduler import filters, scores
from kubegpu.scheduler.engine.cache import NodeCache
from kubegpu.scheduler.engine.records import BASIC_RESOURCES, NAME_LABELS, NodeRule, Plan, fit_order, log

PREPARE_HOOK = "kubegpu_scheduler_prepare"
# Sets of extended resources whose routes `_route` keeps: tenants name extended resources (any domain-qualified name
# is accepted in a pod's requests), so the sets a cluster's pods ask are as many as its tenants make up.
ROUTES_REMEMBERED = 4096
# Every field of a pod but its name and uid, which no plan reads (`Planning.plan`).
ALIKE = attrgetter(*(field.name for field in fields(PodRequest) if field.name not in ("name", "uid")))


class Planning(NodeCache):
    """Planning a pod once per cycle, and the claims, volumes and owners a plan reads."""

    def _route(self, pod: PodRequest) -> dict[str, list[str]]:
        """Group the pod's requested extended resources by owning plugin (`""` for resources no plugin owns)."""
        last, known = self._routed
        if last is pod:
            return known
        requested = frozenset(pod.requested_resources() - BASIC_RESOURCES)
        routes = self._routes.get(requested)
        if routes is None:
            routes = {}
            for resource in sorted(requested):
                owner = self.plugins.owner_of(resource) or ""
                routes.setdefault(owner, []).append(resource)
            if len(self._routes) >= ROUTES_REMEMBERED:
                self._routes.clear()
            self._routes[requested] = routes
        self._routed = (pod, routes)
        return routes

    def validate_devices(self, pod: PodRequest) -> Status:
        """The owning plugins' PreFilter of the pod's device requests (`kubegpu_scheduler_validate`), which
        `schedule` runs before any node: for a front-end that filters the nodes it is handed (the extender), so that
        a request no node can ever take is refused in the plugin's words, not by whichever node filter runs first."""
        return self._validate_devices(pod, self._route(pod))

    def _validate_devices(self, pod: PodRequest, routes: dict[str, list[str]]) -> Status:
        for plugin in routes:
            if not plugin:
                continue
            try:
                status: Status | None = self.plugins.call(plugin, "kubegpu_scheduler_validate", pod=pod)
            except PluginHookError as exc:
                return Status.error(str(exc), plugin=plugin)
            if status is not None and not status.ok:
                return status
        return Status.success()

    def _validate(self, pod: PodRequest, routes: dict[str, list[str]]) -> Status:
        if pod.resource_claims and self._dra_on:
            # DynamicResources' PreFilter: every claim (or template) and class it names exists.
            demands = self.dra.demands(pod)
            if isinstance(demands, Status):
                return Status(demands.code, (f"0/{len(self.nodes)} nodes are available: {demands.message}.",))
        status = self._validate_devices(pod, routes)
        if not status.ok:
            return status
        unowned = routes.get("")
        if unowned and self.plugins.failures:
            known = any(unowned[0] in r.info.allocatable for r in self.nodes.values())
            if not known:
                broken = ", ".join(sorted({f.name for f in self.plugins.failures}))
                return Status.unresolvable(
                    f"no plugin schedules {unowned[0]}; plugin(s) {broken} failed to load (see `kubegpu plugins list`)"
                )
        return Status.success()

    def plan(self, pod: PodRequest) -> Plan:
        """The pod's requests grouped for the filter phase. Remembered for the last pods asked about: the extender
        asks for the same pod's plan in filter, prioritize and bind; and for a pod alike in all but its name and uid
        (`ALIKE`: a plan reads neither), the last such pod's, which a trace's renamed copies and a workload's
        replicas take. A plan whose answers depend on other nodes is made again after every change; any other after
        a change of the placed pods' anti-affinity terms; a pod's that names claims after a change of the claims or
        volumes too."""
        known = self._plans.get(id(pod))
        if known is None or known[0] is not pod:
            known = self._plans_alike.get(id(pod.containers))
            if known is not None and (not self._plans_alike_for(pod) or ALIKE(known[0]) != ALIKE(pod)):
                known = None
        if known is not None:
            plan = known[1]
            if plan.stamp == self._stamp(plan.volatile, pod) and plan.owners == self._owners.epoch:
                if known[0] is not pod:
                    self._keep_plan(pod, plan)
                return plan
        plan = self._plan(pod)
        self._keep_plan(pod, plan)
        return plan

    def _keep_plan(self, pod: PodRequest, plan: Plan) -> None:
        if len(self._plans) >= 256:
            self._plans.clear()
        self._plans[id(pod)] = (pod, plan)
        if self._plans_alike_for(pod):
            if len(self._plans_alike) >= 256:
                self._plans_alike.clear()
            self._plans_alike[id(pod.containers)] = (pod, plan)

    def _plans_alike_for(self, pod: PodRequest) -> bool:
        """Whether pods alike in all but their name and uid may share the pod's plan: not with resource claims (a
        generated claim is named after its pod), nor where a third party added a filter (its `applies` may read any
        field)."""
        return not (pod.resource_claims or self._added_filters)

    def _stamp(self, volatile: bool, pod: PodRequest) -> int:
        """What a plan is made again after: the generation (volatile) or the anti-affinity epoch, plus the volume
        epoch for a pod naming claims (the counters only grow, so the sum moves whenever one of them does)."""
        stamp = (self.generation if volatile else self._anti_epoch) + self._namespace_epoch
        if pod.resource_claims:
            stamp += self.dra.epoch + self.dra.shared_epoch
        return stamp + self._volume_epoch if pod.claims else stamp

    def _plan(self, pod: PodRequest) -> Plan:
        routes = self._route(pod)
        devices = tuple(
            (plugin, tuple((r, max(c.resources.get(r, 0) for c in pod.containers)) for r in resources))
            for plugin, resources in routes.items()
            if plugin
        )
        spread = self.spread_constraints(pod)
        hard = soft = spread  # () for most pods: no constraint of their own, no owner
        if spread:
            hard = tuple(c for c in spread if c.when_unsatisfiable == "DoNotSchedule")
            soft = tuple(c for c in spread if c.when_unsatisfiable == "ScheduleAnyway")
        volatile = bool(pod.pod_affinity or pod.pod_anti_affinity or hard)
        if not volatile and self._placed.anti:
            labels = self._placed.namespace_labels
            volatile = any(filters.pod_matches_term(term, pod, labels) for term in self._placed.anti)
        signature: tuple[object, ...] = (
            tuple((c.name, c.init, tuple(sorted(c.resources.items()))) for c in pod.containers),
            # what each classic init container is given depends on them (a plugin's prepared answer may read them)
            tuple((s.name, tuple(sorted(s.resources.items())), s.sidecars) for s in pod.init_steps),
            pod.cpu_milli,
            pod.memory,
            tuple(sorted(pod.node_selector.items())),
            tuple((t.key, t.operator, t.value, t.effect) for t in pod.tolerations),
            tuple(sorted(pod.annotations.items())),
            tuple(sorted(pod.requests.items())),
            pod.node_affinity,
            pod.host_ports,
            pod.namespace,
            tuple(sorted(pod.labels.items())),
            pod.priority,
            pod.preferred_node_affinity,
        )
        # Interned at once: most pods' signature is this and their `local` too, so one hash of it serves them all
        # (a tuple does not keep its hash; the prepared answers and the identity checks below go by the object).
        signature = base = self._signatures.setdefault(signature, signature)
        prepared = self._prepare(pod, routes, base)
        if pod.claims:
            signature += (pod.namespace, pod.claims, self._volume_epoch)
        drakey = self.dra.demand_key(pod) if pod.resource_claims else ()
        if drakey:
            signature += ("dra", pod.namespace, drakey)
        added, third_party = self._added_filters, False
        node_rules: tuple[NodeRule, ...] = ()
        usage_rules: tuple[NodeRule, ...] = ()
        if added:
            node_rules = tuple(rule.filter for rule in self._node_filters if rule.applies(pod))
            usage_rules = tuple(rule.filter for rule in self._usage_filters if rule.applies(pod))
            third_party = any(rule in added for rule in (*node_rules, *usage_rules))
        local = signature
        nonzero = scores.nonzero_requests(pod)
        # A rule a third party added may read anything of the pod's spec: the pod's answers are then shared only with
        # pods alike in all of it (its signature), never by the few fields kube-scheduler's own rules read.
        if not devices and not third_party and not self._added_scores:
            local = (
                fit_order(pod),
                nonzero,
                tuple((t.key, t.operator, t.value, t.effect) for t in pod.tolerations),
                tuple(sorted(pod.node_selector.items())),
                pod.node_affinity,
                pod.host_ports,
                pod.preferred_node_affinity,
                *((pod.namespace, pod.claims, self._volume_epoch) if pod.claims else ()),
                *(("dra", pod.namespace, drakey) if drakey else ()),
            )
        if local is not base:
            local = self._signatures.setdefault(local, local)
        if not added:  # kube-scheduler's filters alone: which apply follows from what `local` holds
            known = self._rules.get(id(local))
            if known is None or known[0] is not local:
                node_rules = tuple(rule.filter for rule in self._node_filters if rule.applies(pod))
                usage_rules = tuple(rule.filter for rule in self._usage_filters if rule.applies(pod))
                if len(self._rules) >= 4096:
                    self._rules.clear()
                known = self._rules[id(local)] = (local, node_rules, usage_rules)
            node_rules, usage_rules = known[1], known[2]
        if volatile:
            # The namespace epoch too: a relabel moves no node, and a memo keyed by the signature (the extender's
            # answers per shape) must not answer from before it.
            signature += (
                self.generation,
                self._namespace_epoch,
                pod.namespace,
                tuple(sorted(pod.labels.items())),
                pod.pod_affinity,
                pod.pod_anti_affinity,
                spread,
            )
        # Interned, so that comparing a node's remembered signature with this one is mostly an identity check.
        if signature is not base:
            signature = self._signatures.setdefault(signature, signature)
        if len(self._signatures) > 4096:
            self._signatures.clear()
        by_name = any(key in NAME_LABELS for key in pod.node_selector) or any(
            term.fields or any(r.key in NAME_LABELS for r in term.expressions) for term in pod.node_affinity or ()
        )
        return Plan(
            devices,
            tuple((r, pod.total(r)) for r in routes.get("", ())),
            signature,
            local,
            fit=fit_order(pod),
            volatile=volatile,
            settles=not (volatile or by_name or pod.claims or pod.resource_claims),
            stamp=self._stamp(volatile, pod),
            prepared=prepared,
            hard_spread=hard,
            soft_spread=soft,
            owners=self._owners.epoch,
            node_rules=node_rules,
            usage_rules=usage_rules,
            nonzero=nonzero,
        )

    def _prepare(self, pod: PodRequest, routes: dict[str, list[str]], key: tuple[object, ...]) -> dict[str, object]:
        """Each owning plugin's prepared request, remembered per pod signature (`key`, interned: by identity)."""
        plugins = [p for p in routes if p and self.plugins.implements(p, PREPARE_HOOK)]
        if not plugins:
            return {}
        known = self._prepared.get(id(key))
        if known is not None and known[0] is key:
            return known[1]
        prepared: dict[str, object] = {}
        for plugin in plugins:
            try:
                prepared[plugin] = self.plugins.call(plugin, PREPARE_HOOK, pod=pod)
            except PluginHookError as exc:
                log.error("%s", exc)
                prepared[plugin] = exc
        if len(self._prepared) >= 4096:
            self._prepared.clear()
        self._prepared[id(key)] = (key, prepared)
        return prepared

    def set_claim(self, namespace: str, name: str, volume: str | None, deleting: bool = False) -> bool:
        """A PersistentVolumeClaim added or changed (`volume`: the bound volume's name, "" while unbound; `deleting`:
        it has a deletionTimestamp), or deleted (None). Pods naming claims are judged by them once `track_volumes`
        is set. Returns whether the record changed (the answers of pods naming claims are then made again)."""
        key = (namespace, name)
        deleting = deleting and volume is not None
        if self.claims.get(key) == volume and (key in self.deleting_claims) == deleting:
            return False
        if volume is None:
            del self.claims[key]
        else:
            self.claims[key] = volume
        if deleting:
            self.deleting_claims.add(key)
        else:
            self.deleting_claims.discard(key)
        self._volume_epoch += 1
        return True

    def set_volume(self, name: str, terms: tuple[NodeSelectorTerm, ...] | None, *, deleted: bool = False) -> bool:
        """A PersistentVolume added or changed, with its required node affinity terms (None: any node), or deleted.
        Returns whether the record changed."""
        if deleted:
            if name not in self.volumes:
                return False
            del self.volumes[name]
        elif name in self.volumes and self.volumes[name] == terms:
            return False
        else:
            self.volumes[name] = terms
        self._volume_epoch += 1
        return True

    # -- DRA objects (`kubegpu.scheduler.dra`): a change makes the answers of the nodes it touches stale -------------

    def set_device_class(self, name: str, found: dra.DeviceClass | None) -> None:
        """A DeviceClass added, changed or deleted (None)."""
        self.dra.set_class(name, found)

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> bool:
        """A Namespace added or changed with its labels, or deleted (None). Its labels are what pod (anti-)affinity
        terms' `namespaceSelector` reads (`PodIndex.namespaces`), and say whether its claims may have admin access
        (`resource.kubernetes.io/admin-access: "true"`). Returns whether either changed: the plans made before are
        then stale (`_stamp`), since whether a placed pod's term selects a pod may have changed."""
        admin = self.dra.set_namespace(name, labels)
        if not self._placed.set_namespace(name, labels):
            return admin
        self._namespace_epoch += 1
        return True

    @property
    def namespace_epoch(self) -> int:
        """How many times a Namespace's labels changed (`set_namespace`): a memo of what terms select, kept outside
        the engine's plans (the extender's gang plans), is stale once it moves."""
        return self._namespace_epoch

    def set_namespaces(self, labels: Mapping[str, Mapping[str, str]]) -> bool:
        """Every namespace, listed (name -> labels): those known before and not named are gone. Returns whether any
        namespace's labels changed."""
        changed = False
        for name in (self._placed.namespaces.keys() | self.dra.admin_namespaces) - labels.keys():
            changed |= self.set_namespace(name, None)
        for name, found in labels.items():
            changed |= self.set_namespace(name, found)
        return changed

    def set_resource_claim_template(self, namespace: str, name: str, found: dra.Template | None) -> None:
        """A ResourceClaimTemplate added, changed or deleted (None)."""
        self.dra.set_template((namespace, name), found)

    def set_resource_claim(self, namespace: str, name: str, found: dra.Claim | None) -> None:
        """A ResourceClaim added, changed (allocated or reserved by someone) or deleted (None): the devices its
        allocation names are in use, or free again."""
        self._refresh_nodes(self.dra.set_claim((namespace, name), found))

    def set_resource_slice(self, name: str, found: dra.Slice | None) -> None:
        """A ResourceSlice added, changed or deleted (None): the devices of its node (or of every node it is
        shared with) change."""
        self._refresh_nodes(self.dra.set_slice(name, found))

    def _refresh_nodes(self, names: set[str]) -> None:
        if "*" in names:
            names = set(self.nodes)
            self.dra.shared_epoch += 1
        for name in names:
            record = self.nodes.get(name)
            if record is not None:
                self._refresh(record)

    def claim_keys(self) -> list[tuple[str, str]]:
        """The claims the engine knows, as (namespace, name) (`set_claim`)."""
        return list(self.claims)

    def volume_names(self) -> list[str]:
        """The volumes the engine knows (`set_volume`)."""
        return list(self.volumes)

    def set_owner(self, kind: str, namespace: str, name: str, selector: LabelSelector | None) -> bool:
        """A Service, ReplicationController, ReplicaSet or StatefulSet added or changed, with its `spec.selector`
        (None or empty: it selects no pod), or deleted (None). The pods it selects that set no spread constraints of
        their own get the profile's default ones with its selector (`kubegpu.scheduler.owners`). Returns whether
        anything changed."""
        changed = self._owners.set(kind, namespace, name, selector)
        if changed:
            self._defaulted.clear()
        return changed

    def owner_keys(self) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of the owners the engine knows (`set_owner`) that select some pod."""
        return self._owners.keys()

    def spreads_by_owners(self) -> bool:
        """Whether the profile gives pods without spread constraints default ones (`spread_constraints`), so that a
        front-end should report the owners that select pods (`set_owner`); kube-scheduler watches them only then."""
        return bool(self.scoring.default_spread)

    def spread_constraints(self, pod: PodRequest) -> tuple[SpreadConstraint, ...]:
        """The topology spread constraints the pod is scheduled by: its own; else the profile's default constraints
        (`scores.Profile.default_spread`) with the combined selector of its owners (`set_owner`), as kube-scheduler
        1.20 builds them; none when no owner selects it."""
        if pod.spread or not self._owners:
            return pod.spread
        defaults = self.scoring.default_spread
        if not defaults:
            return ()
        selector = self._owners.selector_for(pod.namespace, pod.labels)
        if selector is None:
            return ()
        constraints = self._defaulted.get(selector)
        if constraints is None:
            constraints = tuple(replace(c, selector=selector) for c in defaults)
            if len(self._defaulted) >= 256:
                self._defaulted.clear()
            self._defaulted[selector] = constraints
        return constraints
