"""`kubegpu simulate`: the embedded simulator, the default way to run kubegpu with no cluster.

It reads Kubernetes Node and Pod manifests (YAML, multi-document; or JSON: one object, a `List`, or JSON lines), adds
every Node first, then processes the Pods in document order with the same engine and plugins as the custom scheduler
and the extender. A Pod whose `metadata.deletionTimestamp` is set (or whose phase is Succeeded/Failed) deletes the
earlier pod of that namespace/name and releases its devices; a Pod with `spec.nodeName` is placed on that node.

`--json` prints one object per pod document (the public contract):
`{"pod", "event": "scheduled"|"unschedulable"|"deleted", "node", "reason", "devices", "annotations"}`, where
`devices` equals the `containers` of the `kubegpu.io/allocation` annotation. Pods created one after another (with no
deletion between them) arrive together: those already bound (`spec.nodeName`) are placed first, the others are
scheduled as kube-scheduler's active queue orders them: by priority (`spec.priority`, else the named PriorityClass's
value, else the global default class's), then in document order.
A pod that fits nowhere preempts pods of lower priority where that makes it fit (`kubegpu.scheduler.preemption`):
each victim is removed at once and reported first as `{"pod", "event": "preempted", "node", "by": "ns/name"}`
(with its released `devices`, and the `annotations` it held, its allocation's shares among them), then the
preemptor's `scheduled`. PodDisruptionBudget (`status.disruptionsAllowed`,
else computed from its spec), PersistentVolumeClaim, PersistentVolume and PriorityClass documents are read too, and
Service, ReplicationController, ReplicaSet and StatefulSet documents, whose selectors give the pods they select that
set no `topologySpreadConstraints` kube-scheduler's default spread over hosts and zones (`kubegpu.scheduler.owners`).
Gangs (docs/gangs.md): `PodGroup` documents (`scheduling.x-k8s.io/v1alpha1`) and one Kueue `Topology` document
(`spec.levels[].nodeLabel`, widest first; without one, AWS's network-node-layer labels and `nvidia.com/gpu.clique`
are the levels) are read; a pod labelled `scheduling.x-k8s.io/pod-group` or `kueue.x-k8s.io/pod-group-name` waits
until its gang's `minMember` members have arrived, then the gang is placed whole (`Engine.place_gang`), or after
evicting pods of lower priority from one domain (`preempted` events with `"by": "ns/gang"`), or not at all. Each
member's event carries `"gang": "ns/name"`; members whose gang never completes are reported unschedulable at the
end. The report lists the domains of the narrowest level (racks, cliques) with their gangs, and the gangs unplaced
with their reason.
DRA's DeviceClass, ResourceSlice, ResourceClaim and ResourceClaimTemplate documents (`resource.k8s.io/v1`) are read
too (and Namespace documents, for the `resource.kubernetes.io/admin-access` label that lets claims ask for admin
access): a pod's `spec.resourceClaims` are allocated as kube-scheduler 1.34 would (`kubegpu.scheduler.dra`; a claim from
a template is named `<pod>-<claim>` and goes with its pod), and its event carries `"claims"`: each pod claim name ->
`{"name", "allocation", "reservedFor"}`, the allocation in the upstream shape of the claim's `status.allocation`.
Without `--json` it prints a report: placements, per-node device occupancy maps and a summary, every name, device id
and reason from the input escaped and bounded as `kubegpu.core.text.safe_text` makes it (a file is someone else's
text: an escape sequence in a pod name must not reach the terminal). Invalid input exits
with status 2 and a message naming the document and field, before anything is scheduled; unschedulable pods are not
an error.

Every input is a file someone handed over, so reading one is bounded, and a bad one exits with status 2 and a
message naming the file: at most `MAX_INPUT_BYTES` (64 MiB) per file and `MAX_DOCUMENTS` (1,000,000) documents;
UTF-8 text only (no NUL bytes); YAML nested at most `MAX_DEPTH` (100) levels (libyaml's composer recurses on the C
stack and crashes the process some 25,000 levels down), aliases and merge keys standing for at most
`MAX_ALIAS_NODES` (100,000) nodes per document (an 800-byte chain of anchors doubles at every level), integers of at
most 64 characters; JSON nested at most 1024 levels (orjson's own limit). Too deep is worded one way, "nested more
than N levels deep" with the file and line, whichever layer stops it first (libyaml's scanner, PyYAML, orjson or
kubegpu's composer). A reader that goes away early
(`kubegpu simulate ... | head`) ends the run quietly with status 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson
import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import Node
from yaml.resolver import Resolver

from kubegpu.core import dra
from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation
from kubegpu.core.errors import InputError, shorten
from kubegpu.core.manifests import ManifestError, is_extended_resource, node_info, pod_request
from kubegpu.core.models import NodeInfo, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.quantity import parse_quantity
from kubegpu.core.status import Code
from kubegpu.core.text import safe_text
from kubegpu.scheduler import objects, podgroups, traces
from kubegpu.scheduler.engine import POLICIES, Decision, Engine, PermitCode, rule_names
from kubegpu.scheduler.owners import OWNER_KINDS
from kubegpu.scheduler.preemption import Budget

if TYPE_CHECKING:
    from kubegpu.scheduler.config import Policy

__all__ = ["SimulationError", "add_simulate_parser", "load_documents", "run", "young_collections_only"]

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
MAX_MAPS = 40
MAX_INPUT_BYTES = 64 * 1024 * 1024
MAX_DOCUMENTS = 1_000_000
MAX_DEPTH = 100
MAX_JSON_DEPTH = 1024  # orjson's own limit, which it words as "depth limit exceeded"
MAX_ALIAS_NODES = 100_000
MAX_INTEGER_CHARS = 64


class SimulationError(InputError):
    """Invalid simulator input; the message names the file, the document and the field."""


@dataclass(frozen=True, slots=True)
class PodEvent:
    where: str
    request: PodRequest
    deleting: bool


# ------------------------------------------------------------------------------------------------------------
# Reading input files: bounded in size, nesting, alias expansion and integer length
# ------------------------------------------------------------------------------------------------------------


def _bounded_int(loader: Any, node: Any) -> Any:
    """YAML integers as PyYAML reads them, but short: `1:1:1:...` (base 60) or 5000 digits cost quadratic time."""
    if len(node.value) > MAX_INTEGER_CHARS:
        raise ConstructorError(
            None, None, f"an integer of {len(node.value)} characters (at most {MAX_INTEGER_CHARS})", node.start_mark
        )
    return SafeConstructor.construct_yaml_int(loader, node)


def _scalar(construct: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A scalar constructor whose Python errors (`!!int abc`, `!!bool maybe`, `2001-02-30`, `!!int ""`) are YAML
    errors: PyYAML's constructors trust the resolver's patterns, which an explicit tag bypasses."""

    def checked(loader: Any, node: Any) -> Any:
        try:
            return construct(loader, node)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # ValueError, KeyError, IndexError, AttributeError...: all mean a bad scalar
            what = f"{shorten(str(node.tag).rsplit(':', 1)[-1])} {shorten(str(node.value))!r}"
            raise ConstructorError(None, None, f"{what}: {shorten(str(exc))}", node.start_mark) from None

    return checked


_SCALARS = {
    "tag:yaml.org,2002:int": _bounded_int,
    "tag:yaml.org,2002:float": SafeConstructor.construct_yaml_float,
    "tag:yaml.org,2002:bool": SafeConstructor.construct_yaml_bool,
    "tag:yaml.org,2002:timestamp": SafeConstructor.construct_yaml_timestamp,
}


try:
    from yaml import CSafeLoader as _FastBase
    from yaml.cyaml import CParser as _EventSource  # type: ignore[attr-defined]  # the stubs leave it out
except ImportError:  # PyYAML built without libyaml
    _FastBase = yaml.SafeLoader  # type: ignore[assignment,misc]
    _EventSource = None  # type: ignore[assignment,misc]


class _FastLoader(_FastBase):
    """libyaml all the way: for text that `_plainly_shallow` has shown cannot nest deeply or use aliases."""


for _tag, _construct in _SCALARS.items():
    _FastLoader.add_constructor(_tag, _scalar(_construct))


class _CheckedComposer(Composer):
    """PyYAML's composer, counting nesting depth and the nodes that aliases stand for as it builds each document."""

    peek_event: Callable[[], Any]  # the parser's, further down the loader's bases
    _depth = 0
    _aliased = 0  # nodes that aliases (merge keys included) stand for, in this document
    _composed = 0  # nodes composed so far in this document, each alias counted as the nodes it stands for
    _sizes: dict[str, int]

    def compose_document(self) -> Node | None:
        self._depth = self._aliased = self._composed = 0
        self._sizes = {}
        node: Node | None = super().compose_document()
        return node

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event: Any = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            size = self._sizes.get(event.anchor or "", 1)
            self._aliased += size
            self._composed += size
            if self._aliased > MAX_ALIAS_NODES:
                mark: Any = event.start_mark
                raise ComposerError(None, None, f"aliases stand for more than {MAX_ALIAS_NODES} nodes", mark)
            node: Node | None = super().compose_node(parent, index)
            return node
        if self._depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        self._depth += 1
        first = self._composed
        self._composed += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._sizes[anchor] = self._composed - first
        return node


class _PurePythonCheckedLoader(_CheckedComposer, yaml.SafeLoader):
    """PyYAML's pure-Python scanner and parser under the checking composer: used where PyYAML has no libyaml."""


_CheckedLoader: type[Any] = _PurePythonCheckedLoader
if _EventSource is not None:

    class _LibyamlCheckedLoader(_CheckedComposer, _EventSource, SafeConstructor, Resolver):
        """libyaml's parser (events only: it does not recurse) under the checking composer."""

        def __init__(self, stream: str) -> None:
            _EventSource.__init__(self, stream)
            _CheckedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    _CheckedLoader = _LibyamlCheckedLoader

_CHECKED_LOADERS: tuple[type[Any], ...] = (_PurePythonCheckedLoader, _CheckedLoader)
for _loader in set(_CHECKED_LOADERS):
    for _tag, _construct in _SCALARS.items():
        _loader.add_constructor(_tag, _scalar(_construct))

# Where a document ends: `---` or `...` at the start of a line. libyaml ends a document there whatever came before
# (a scalar stops, a flow collection is an error), so no document spans two of these pieces.
_DOCUMENT_MARKER = re.compile(r"^(?:---|\.\.\.)(?=[ \t\r\n]|$)", re.MULTILINE)
# The longest run of spaces and indicators (`- `, `? `, `: `) that starts a line bounds the column of any block
# collection that starts on it. YAML also breaks lines at `\r`, NEL, LS and PS: text holding those is read as `\n`.
_INDENT_LIMIT = 40
_DEEP_INDENT = re.compile(rf"\n[ \t?:-]{{{_INDENT_LIMIT}}}")
_OTHER_BREAKS = re.compile("[\r\x85\u2028\u2029]")
_FLOW_LIMIT = MAX_DEPTH - 2 * _INDENT_LIMIT


def _plainly_shallow(text: str) -> bool:
    """Whether `text` provably nests at most `MAX_DEPTH` levels and uses no alias, judged in C-speed passes.

    Block collections nest only at strictly larger columns, but for one sequence at its mapping's column, so with no
    line starting with `_INDENT_LIMIT` or more spaces and indicators they nest at most 2 * `_INDENT_LIMIT` deep; flow
    collections nest at most as deep as a document has `[` and `{`. An alias needs an anchor (`&`).
    """
    if "&" in text:
        return False
    lines = "\n" + (_OTHER_BREAKS.sub("\n", text) if _OTHER_BREAKS.search(text) else text)
    if _DEEP_INDENT.search(lines):
        return False
    return all(piece.count("[") + piece.count("{") <= _FLOW_LIMIT for piece in _DOCUMENT_MARKER.split(text))


# How the layers under the composer word their own nesting limits (libyaml 0.2.5's "exceeded maximum nesting depth",
# orjson's "depth limit exceeded", "recursion limit" elsewhere): a user reads kubegpu's wording whichever stops first.
_NESTING_PROBLEM = re.compile(r"nesting|depth limit|recursion limit|too deep", re.IGNORECASE)


def _load_yaml(text: str, name: str, checked: type[Any] | None = None) -> Iterator[Any]:
    """The documents of a YAML text; `checked` is the loader for text that may nest deeply or use aliases (the
    libyaml-backed one where PyYAML has libyaml; the tests also pass the pure-Python one)."""
    loader: Any = _FastLoader if _plainly_shallow(text) else (checked or _CheckedLoader)
    try:
        for count, document in enumerate(yaml.load_all(text, Loader=loader), 1):
            if count > MAX_DOCUMENTS:
                raise SimulationError(f"{name}: more than {MAX_DOCUMENTS} YAML documents")
            if document is not None:
                yield document
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = str(getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__)
        if _NESTING_PROBLEM.search(problem):  # libyaml's or PyYAML's own limit stopped it before the composer's
            problem = f"nested more than {MAX_DEPTH} levels deep"
        raise SimulationError(f"{name}:{where}: not valid YAML ({shorten(problem, 200)})") from None
    except RecursionError:  # a PyYAML whose scanner or parser recurses, before the composer saw the depth
        raise SimulationError(f"{name}: not valid YAML (nested more than {MAX_DEPTH} levels deep)") from None


def _read_text(path: Path) -> str:
    """The file's text: at most `MAX_INPUT_BYTES` of UTF-8 without NUL bytes (an optional BOM dropped)."""
    stdin = str(path) == "-"
    name = "standard input" if stdin else str(path)
    try:
        if stdin:
            source = getattr(sys.stdin, "buffer", None)
            data = source.read(MAX_INPUT_BYTES + 1) if source is not None else sys.stdin.read().encode()
        else:
            with path.open("rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise SimulationError(f"{name}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise SimulationError(f"{name}: larger than {MAX_INPUT_BYTES >> 20} MiB; split it into several files")
    zero = data.find(b"\0")
    if zero >= 0:
        raise SimulationError(f"{name}: binary data (a NUL byte at offset {zero}), not a YAML or JSON text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SimulationError(
            f"{name}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")


def _read_documents(path: Path) -> Iterator[tuple[str, Any]]:
    """(label, document) pairs of one file; `label` is `file#N` (N counts documents from 1)."""
    text = _read_text(path)
    stripped = text.lstrip()
    documents: Iterator[Any] | list[Any]
    if stripped.startswith(("{", "[")):
        try:
            documents = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            documents = []
            # JSON lines end at `\n` only: U+2028 and the like are ordinary characters inside a JSON string.
            for number, line in enumerate(text.split("\n"), 1):
                if not line.strip():
                    continue
                try:
                    documents.append(orjson.loads(line))
                except orjson.JSONDecodeError as exc:
                    problem = (
                        f"nested more than {MAX_JSON_DEPTH} levels deep" if _NESTING_PROBLEM.search(str(exc)) else exc
                    )
                    raise SimulationError(f"{path}: line {number}: not valid JSON ({problem})") from None
    else:
        documents = _load_yaml(text, str(path))
    number = 0
    for document in documents:
        items = document if isinstance(document, list) else [document]
        for item in items:
            if isinstance(item, dict) and item.get("kind") == "List":
                inner = item.get("items")
                if not isinstance(inner, list):
                    number += 1
                    raise SimulationError(f"{path}#{number}: items: a List needs an items array")
                if number + len(inner) > MAX_DOCUMENTS:
                    raise SimulationError(f"{path}: more than {MAX_DOCUMENTS} documents")
                for element in inner:
                    number += 1
                    yield f"{path}#{number}", element
            else:
                number += 1
                if number > MAX_DOCUMENTS:
                    raise SimulationError(f"{path}: more than {MAX_DOCUMENTS} documents")
                yield f"{path}#{number}", item


def load_documents(
    paths: list[Path],
    objects: list[tuple[str, str, dict[str, Any]]] | None = None,
    qualifiers: Mapping[str, str] | None = None,
) -> tuple[list[NodeInfo], list[PodEvent]]:
    """Parse and validate every document up front, so bad input fails before anything is scheduled. Documents of
    the other kinds scheduling reads (`OBJECT_KINDS`) are added to `objects` as (kind, label, document); pods are
    read with the plugins' `qualifiers` (`pod_request`)."""
    nodes: list[NodeInfo] = []
    pods: list[PodEvent] = []
    seen_nodes: set[str] = set()
    for path in paths:
        for label, document in _read_documents(path):
            if not isinstance(document, dict):
                raise SimulationError(f"{label}: expected a Node or Pod object, got {type(document).__name__}")
            kind = document.get("kind")
            try:
                if kind == "Node":
                    info = node_info(document)
                    if info.name in seen_nodes:
                        raise SimulationError(f"{label}: metadata.name: node {info.name!r} is defined twice")
                    seen_nodes.add(info.name)
                    nodes.append(info)
                elif kind == "Pod":
                    request, deleting = pod_request(document, qualifiers)
                    _check_not_overcommitted(document)
                    deleting = deleting or request.phase in FINISHED_PHASES
                    pods.append(PodEvent(label, request, deleting))
                elif kind in OBJECT_KINDS:
                    OBJECT_KINDS[kind](document)  # validated now, applied when the run starts
                    if objects is not None:
                        objects.append((kind, label, document))
                else:
                    raise SimulationError(
                        f"{label}: kind: expected Node, Pod, {', '.join(OBJECT_KINDS)} or List, got {kind!r}"
                    )
            except SimulationError:
                raise
            except InputError as exc:
                raise SimulationError(f"{label}: {exc}") from None
    return nodes, pods


def _check_not_overcommitted(document: dict[str, Any]) -> None:
    """The API server's rule for a resource that cannot be overcommitted (an extended resource such as
    `nvidia.com/gpu`, hugepages): a container (or the pod, in `spec.resources`) that requests it sets a limit, and
    the request equals it. Checked on the simulator's input, where a pod the API server refuses must not be placed;
    the shared reader takes a request alone (`core.manifests`), as kube-scheduler's own tests ask them. Call after
    `pod_request` accepted the document: its shape and quantities are known to be sound."""
    spec = document.get("spec") or {}
    # Pod-level resources (`spec.resources`, 1.32+) are checked as a container's are.
    holders = [("spec.resources", "the pod", spec)] + [
        (f"spec.{field}[{index}].resources", f"container {shorten(str(container.get('name')))!r}", container)
        for field in ("initContainers", "containers")
        for index, container in enumerate(spec.get(field) or ())
    ]
    for where, owner, holder in holders:
        resources = holder.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name, asked in requests.items():
            if not (is_extended_resource(name) or name.startswith("hugepages-")):
                continue
            shown = shorten(name)
            if name not in limits:
                raise ManifestError(
                    f"{where}.limits[{shown}]: a limit must be set for {shown} ({owner} requests it), which "
                    "cannot be overcommitted; the API server refuses a request alone"
                )
            request, limit = parse_quantity(asked), parse_quantity(limits[name])
            if request != limit:
                raise ManifestError(
                    f"{where}.requests[{shown}]: {request.normalize():f} must equal its limit "
                    f"{limit.normalize():f} ({owner}); {shown} cannot be overcommitted"
                )


def _event(decision: Decision) -> dict[str, Any]:
    event = {
        "pod": decision.pod,
        "event": "scheduled" if decision.scheduled else "unschedulable",
        "node": decision.node,
        "reason": decision.reason,
        "devices": decision.allocation.containers if decision.allocation is not None else {},
        "annotations": decision.annotations,
    }
    if decision.claims:
        event["claims"] = decision.claims
    return event


def claim_devices(claims: dict[str, Any]) -> str:
    """A pod's DRA claims on one line: `gpu=neuron.kubegpu.io/node-1/neuron-0,...; ...`."""
    return "; ".join(
        f"{ref}="
        + ",".join(f"{r['driver']}/{r['pool']}/{r['device']}" for r in claim["allocation"]["devices"]["results"])
        for ref, claim in claims.items()
    )


def _whole(decode: Callable[[dict[str, Any]], dra.Claim | dra.Template], document: dict[str, Any]) -> object:
    """A ResourceClaim or ResourceClaimTemplate of the simulator's files, read whole: a spec it cannot read is the
    file's error, naming the field (a cluster's is read without it then: `dra.resource_claim`)."""
    found = decode(document)
    if found.problem is not None:
        raise dra.DraError(found.problem)
    return found


OBJECT_KINDS: dict[str, Callable[[dict[str, Any]], object]] = {
    "PodDisruptionBudget": objects.budget,
    "PersistentVolumeClaim": objects.claim,
    "PersistentVolume": objects.volume,
    "PriorityClass": objects.priority_class,
    **{kind: partial(objects.owner, kind) for kind in OWNER_KINDS},
    "PodGroup": podgroups.pod_group,
    "Topology": podgroups.topology_levels,
    "Namespace": objects.namespace,
    "DeviceClass": dra.device_class,
    "ResourceSlice": dra.resource_slice,
    "ResourceClaim": partial(_whole, dra.resource_claim),
    "ResourceClaimTemplate": partial(_whole, dra.resource_claim_template),
}


@dataclass(slots=True)
class Cluster:
    """The objects besides Nodes and Pods, applied to the engine; budgets and classes kept for the run."""

    budgets: list[dict[str, Any]]
    classes: dict[str, objects.PriorityClass]
    topology: str | None = None  # where the Topology came from (one per run)

    @classmethod
    def load(cls, engine: Engine, found: list[tuple[str, str, dict[str, Any]]]) -> Cluster:
        cluster = cls([], {})
        engine.track_volumes = True
        for kind, label, document in found:
            if kind == "PodGroup":
                engine.set_pod_group(podgroups.pod_group(document))
            elif kind == "Topology":
                if cluster.topology is not None:
                    raise SimulationError(
                        f"{label}: kind: a second Topology (the first is {cluster.topology}); gangs are placed by one"
                    )
                cluster.topology = label
                engine.set_topology(podgroups.topology_levels(document))
            elif kind == "PodDisruptionBudget":
                cluster.budgets.append(document)
            elif kind == "PersistentVolumeClaim":
                engine.set_claim(*objects.claim(document))
            elif kind == "PersistentVolume":
                engine.set_volume(*objects.volume(document))
            elif kind == "PriorityClass":
                found_class = objects.priority_class(document)
                cluster.classes[found_class.name] = found_class
            elif kind in OWNER_KINDS:
                engine.set_owner(*objects.owner(kind, document))
            elif kind == "Namespace":
                engine.set_namespace(*objects.namespace(document))
            elif kind == "DeviceClass":
                device_class = dra.device_class(document)
                engine.set_device_class(device_class.name, device_class)
            elif kind == "ResourceSlice":
                piece = dra.resource_slice(document)
                engine.set_resource_slice(piece.name, piece)
            elif kind == "ResourceClaim":
                claim = dra.resource_claim(document)
                engine.set_resource_claim(claim.namespace, claim.name, claim)
            elif kind == "ResourceClaimTemplate":
                template = dra.resource_claim_template(document)
                engine.set_resource_claim_template(template.namespace, template.name, template)
        return cluster

    def resolve(self, pod: PodRequest) -> PodRequest:
        """The pod's priority from its PriorityClass (the API server's own too: `SYSTEM_PRIORITY_CLASSES`), or the
        global default class, when `spec.priority` is unset."""
        if pod.priority or not (self.classes or pod.priority_class in SYSTEM_PRIORITY_CLASSES):
            return pod
        named = self.classes.get(pod.priority_class) or SYSTEM_PRIORITY_CLASSES.get(pod.priority_class)
        if named is None and not pod.priority_class:
            named = next((c for c in self.classes.values() if c.global_default), None)
        if named is None:
            return pod
        policy = pod.preemption_policy if pod.preemption_policy != "PreemptLowerPriority" else named.preemption_policy
        return replace(pod, priority=named.value, preemption_policy=policy)

    def budgets_for(self, engine: Engine) -> list[Budget]:
        placed = [placement.request for placement in engine.placements()]
        return [objects.budget(document, placed) for document in self.budgets]


# The API server's own classes, which every cluster has (a pod names them without a document making them).
SYSTEM_PRIORITY_CLASSES = {
    name: objects.PriorityClass(name, value)
    for name, value in (("system-cluster-critical", 2_000_000_000), ("system-node-critical", 2_000_001_000))
}


def _queue_order(event: PodEvent) -> tuple[bool, int]:
    return event.request.node_name is None, -event.request.priority


def _arrivals(pods: list[PodEvent], cluster: Cluster) -> Iterator[PodEvent]:
    """Pod events in the order the active queue takes them: in each run of creations the bound pods, then the others
    by priority, then document order; deletions stay where they are."""
    batch: list[PodEvent] = []
    for event in pods:
        if event.deleting:
            yield from sorted(batch, key=_queue_order)
            batch.clear()
            yield event
            continue
        named = event.request.priority_class
        if named and named not in cluster.classes and named not in SYSTEM_PRIORITY_CLASSES:
            raise SimulationError(
                f"{event.where}: spec.priorityClassName: no PriorityClass {shorten(named)!r} among the documents; "
                "the API server refuses a pod naming a class that does not exist"
            )
        request = cluster.resolve(event.request)
        batch.append(event if request is event.request else PodEvent(event.where, request, False))
    yield from sorted(batch, key=_queue_order)


def _process(
    engine: Engine, pods: list[PodEvent], latencies: list[float], cluster: Cluster | None = None
) -> Iterator[dict[str, Any]]:
    clock = time.perf_counter
    live: set[str] = set()
    cluster = cluster or Cluster([], {})
    gathering: dict[str, list[PodRequest]] = {}  # gang -> its members arrived, not placed yet
    waiting: set[str] = set()  # the keys of the members in `gathering`
    for event in _arrivals(pods, cluster):
        request = event.request
        started = clock()
        if event.deleting:
            if request.key in waiting:
                waiting.discard(request.key)
                for members in gathering.values():
                    members[:] = [m for m in members if m.key != request.key]
            released = engine.release(request.key)
            latencies.append(clock() - started)
            live.discard(request.key)
            yield {
                "pod": request.key,
                "event": "deleted",
                "node": released.node if released else None,
                "reason": None if released else "no scheduled pod of that name to delete",
                "devices": released.allocation.containers if released and released.allocation else {},
                "annotations": {},
            }
            continue
        if request.key in live or request.key in waiting:
            state = "scheduled" if request.key in live else "waiting for its gang"
            raise SimulationError(
                f"{event.where}: metadata.name: pod {request.key} is already {state}; delete it first "
                "(a Pod document with metadata.deletionTimestamp)"
            )
        refusal = engine.pre_enqueue(request)  # PreEnqueue (SchedulingGates): no cycle until a later document lifts it
        if refusal is not None:
            yield {
                "pod": request.key,
                "event": "gated",
                "node": None,
                "reason": refusal.message,
                "devices": {},
                "annotations": {},
            }
            continue
        if podgroups.gang_key(request) is not None:
            try:
                group = engine.gang_of(request)
            except InputError as exc:
                yield {**_event(Decision(request.key, False, reason=str(exc))), "gang": podgroups.gang_key(request)}
                continue
            if group is not None:
                members = gathering.setdefault(group.key, [])
                members.append(request)
                waiting.add(request.key)
                if len(members) + len(engine.gang_holders(group)) >= group.min_member:
                    del gathering[group.key]
                    waiting.difference_update(m.key for m in members)
                    yield from _place_gang(engine, group, members, cluster, live)
                    latencies.extend([(clock() - started) / len(members)] * len(members))
                continue
        decision = engine.schedule(request)
        if not decision.scheduled and decision.code is not Code.ERROR:
            preemption = engine.preempt(request, cluster.budgets_for(engine) if cluster.budgets else ())
            if preemption.node is not None:
                for key in preemption.victims:
                    released = engine.release(key)
                    live.discard(key)
                    yield {
                        "pod": key,
                        "event": "preempted",
                        "node": preemption.node,
                        "by": request.key,
                        "reason": f"preempted by {request.key} (priority {request.priority})",
                        "devices": released.allocation.containers if released and released.allocation else {},
                        # its allocation, whose `shares` the report shows (a share's GPU id read as its amount)
                        "annotations": released.annotations if released else {},
                    }
                decision = engine.reserve(request, preemption.node)
        latencies.append(clock() - started)
        if decision.scheduled:
            live.add(request.key)
        yield _event(decision)
    for key, members in gathering.items():
        group = engine.gang_of(members[0]) if members else None
        if group is None:
            continue
        reason = (
            f"gang {key}: {len(members) + len(engine.gang_holders(group))} of minMember {group.min_member} members "
            f"arrived; none holds a place (a live scheduler waits {group.timeout_seconds}s for the others)"
        )
        for member in members:
            yield {**_event(Decision(member.key, False, reason=reason)), "gang": key}


def _place_gang(
    engine: Engine, group: podgroups.PodGroup, members: list[PodRequest], cluster: Cluster, live: set[str]
) -> Iterator[dict[str, Any]]:
    """A gang whose `minMember` members have arrived: placed whole, or after evicting pods of lower priority
    from one domain (`Engine.preempt_gang`), or none of it placed. Each member's event names its gang."""
    placement = engine.place_gang(members, group)
    if not placement.placed and placement.code is Code.UNSCHEDULABLE:
        preemption = engine.preempt_gang(members, group, cluster.budgets_for(engine) if cluster.budgets else ())
        if preemption.domain is not None:
            priority = min(m.priority for m in members)
            for key in preemption.victims:
                released = engine.release(key)
                live.discard(key)
                yield {
                    "pod": key,
                    "event": "preempted",
                    "node": released.node if released else None,
                    "by": group.key,
                    "reason": f"preempted by gang {group.key} (priority {priority}) for {preemption.domain}",
                    "devices": released.allocation.containers if released and released.allocation else {},
                    "annotations": released.annotations if released else {},
                }
            placement = engine.place_gang(members, group)
    requests = {m.key: m for m in members}
    for decision in placement.decisions:
        if decision.scheduled and decision.pod in requests:
            answer = engine.permit(requests[decision.pod], now=0.0)
            if answer.code is PermitCode.REJECT:
                decision = Decision(decision.pod, False, reason=answer.reason, code=Code.UNSCHEDULABLE)
            else:
                live.add(decision.pod)
        yield {**_event(decision), "gang": group.key}


def _shares(
    annotations: Mapping[str, str],
) -> tuple[dict[str, dict[str, dict[str, int]]], dict[str, dict[str, list[str]]]]:
    """The `shares` and the init containers' devices (`init`) of the allocation the engine wrote
    (`AllocationRecord`); empty for a pod of whole devices and no such init container."""
    text = annotations.get(ALLOCATION_KEY)
    if not text:
        return {}, {}
    record = decode_allocation(text)
    return record.shares, record.init


def _held(resource: str, ids: list[str], amounts: Mapping[str, int] | None, qualifier: bool) -> str:
    """One resource of a placement: `gpu=0,1`; for a share, the amount of each device with it (`gpucores=30 on 0`,
    `gpumem=3000 on 0,1`): the ids alone read as amounts (a 30 % share of GPU 0 showed `gpucores=0`). A resource
    counted one per device (a GPU's share slot) shows its ids, as a whole device's."""
    name = resource.split("/")[-1]
    if not amounts or (not qualifier and all(amounts.get(i) == 1 for i in ids)):
        return f"{name}={','.join(ids)}"
    values = {amounts.get(i) for i in ids}
    if len(values) == 1:
        return f"{name}={values.pop()} on {','.join(ids)}"
    return f"{name}=" + " + ".join(f"{amounts.get(i)} on {i}" for i in ids)


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _report(engine: Engine, events: list[dict[str, Any]], out: IO[str], elapsed: float) -> None:
    from kubegpu.scheduler.report import (  # only here: a trace's replay starts without it
        capacity_held,
        draw_text,
        gang_domains,
    )

    write = out.write
    placed = [e for e in events if e["event"] == "scheduled"]
    write(
        f"kubegpu simulate: {len(engine.node_names())} nodes, {len(events)} pod documents, "
        f"policy {engine.policy}, {elapsed:.2f}s\n\n"
    )
    write("PLACEMENTS\n")
    write(f"  {'POD':40} {'EVENT':14} {'NODE':24} DEVICES\n")
    qualifiers = engine.plugins.qualifiers
    for e in events:
        shares, init = _shares(e["annotations"])
        # The app containers' devices, then what each classic init container is given of them, with the amounts of
        # a share it is given or lent (an init container's 30 % of the app's whole GPU: `gpucores=30 on 0`).
        listed = [(c, c, res) for c, res in e["devices"].items()] + [(c, f"{c} (init)", res) for c, res in init.items()]
        devices = "; ".join(
            f"{shown}: "
            + ", ".join(
                _held(r, ids, shares.get(c, {}).get(r), r in qualifiers)
                for r, ids in {**res, **{r: list(a) for r, a in shares.get(c, {}).items() if r not in res}}.items()
            )
            for c, shown, res in listed
        )
        if e.get("claims"):
            devices = "; ".join(filter(None, (devices, "claims: " + claim_devices(e["claims"]))))
        pod, node, devices = safe_text(e["pod"]), safe_text(e["node"] or "-"), safe_text(devices or "-")
        write(f"  {pod:40} {e['event']:14} {node:24} {devices}\n")
    write("\nDEVICE OCCUPANCY\n")
    families: dict[str, Counter[str]] = {}
    fragmentation: Counter[str] = Counter()
    held: defaultdict[str, float] = defaultdict(float)
    shown = 0
    busy = [n for n in engine.node_names() if engine.has_devices(n)]
    for name in busy:
        pictures = engine.describe(name)
        for picture in pictures:
            tally = families.setdefault(picture.family, Counter())
            tally["total"] += picture.total
            tally["free"] += picture.free
            tally["used"] += sum(1 for c in picture.cells if c.used > 0)
            held[picture.family] += capacity_held(picture)
            fragmentation[picture.family] += max(0, picture.free - picture.largest_fit)
        holders = engine.holders(name)
        if pictures and shown < MAX_MAPS and (holders or len(busy) <= MAX_MAPS):
            shown += 1
            write(f"  {safe_text(name)} ({len(holders)} pods)\n")
            for picture in pictures:
                for line in draw_text(picture):
                    write(line + "\n")
    if len(busy) > shown:
        write(f"  ... {len(busy) - shown} more nodes with devices not drawn (use --json for every placement)\n")
    write("\nSUMMARY\n")
    write(
        f"  scheduled {len(placed)}, unschedulable {sum(1 for e in events if e['event'] == 'unschedulable')}, "
        f"gated {sum(1 for e in events if e['event'] == 'gated')}, "
        f"deleted {sum(1 for e in events if e['event'] == 'deleted')}\n"
    )
    for family, tally in sorted(families.items()):
        total = tally["total"] or 1
        write(
            f"  {safe_text(family)}: {tally['used']}/{tally['total']} devices in use, "
            f"{100 * held[family] / total:.0f}% of their capacity held, "
            f"{tally['free']} free, {fragmentation[family]} stranded (free but outside the largest request that "
            "still fits its node)\n"
        )
    domains, unplaced = gang_domains(engine, events)
    if domains or unplaced:
        write(f"\nGANGS (domains by {safe_text(domains[0].level)})\n" if domains else "\nGANGS (none placed)\n")
        for domain in domains:
            gangs = ", ".join(f"{safe_text(gang)} ({count})" for gang, count in domain.gangs)
            write(f"  {safe_text(domain.name):24} {domain.nodes:5d} nodes  {gangs}\n")
        for gang in unplaced:
            write(f"  unplaced {safe_text(gang.pod)}: {safe_text(gang.reason)}\n")
    reasons = Counter(e["reason"] for e in events if e["event"] == "unschedulable")
    if reasons:
        write("  unschedulable pods by reason:\n")
        for reason, count in reasons.most_common():
            write(f"    {count:5d}  {safe_text(str(reason))}\n")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except BrokenPipeError:
        # The reader went away (`kubegpu simulate ... | head`): it has all it wanted. Point stdout at devnull, as
        # Python's documentation recommends, so the flush at exit does not fail a second time.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


def _engine(args: argparse.Namespace) -> Engine | None:
    """The engine the arguments ask for (`--policy`, `--config`); None after printing why the configuration is bad."""
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        print(f"kubegpu simulate: warning: {failure}", file=sys.stderr)
    config = None
    policy: Policy = args.policy or "binpack"
    if args.config:
        # Only with --config: the configuration's models cost ~25 ms to import, a tenth of the simulator's start.
        from kubegpu.scheduler.config import ConfigError, RuleNames, load_config

        try:
            config, policy = load_config(args.config, args.policy, RuleNames(*rule_names(plugins)))
        except ConfigError as exc:
            print(f"kubegpu simulate: invalid --config: {exc}", file=sys.stderr)
            return None
    return Engine(plugins, policy=policy, scoring=config.profile if config else None)


def _run_trace(args: argparse.Namespace) -> int:
    """`--trace-nodes N --trace-pods P`: the trace replayed, its allocation curve printed (module docstring)."""
    if not (args.trace_nodes and args.trace_pods) or args.files:
        print(
            "kubegpu simulate: a trace is two files, --trace-nodes NODES.csv and --trace-pods PODS.csv, and no "
            "manifest FILE beside them",
            file=sys.stderr,
        )
        return 2
    mode: traces.Mode = "timeline" if args.timeline else "experiment"
    try:
        nodes = traces.read_nodes(Path(args.trace_nodes))
        pods = traces.read_pods(Path(args.trace_pods), times=mode == "timeline")
    except traces.TraceError as exc:
        print(f"kubegpu simulate: invalid trace: {safe_text(str(exc))}", file=sys.stderr)
        return 2
    engine = _engine(args)
    if engine is None:
        return 2
    latencies: list[float] = []
    started = time.perf_counter()
    try:
        result = traces.replay(
            engine, nodes, pods, mode, inflate=args.inflate, seed=args.seed, keep_events=bool(args.html),
            latencies=latencies, clock=time.perf_counter,
        )  # fmt: skip
    except traces.TraceError as exc:
        print(f"kubegpu simulate: invalid trace: {safe_text(str(exc))}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    summary = result.summary()
    caption = _trace_caption(args, result, engine)
    if args.json:
        sys.stdout.buffer.write(
            # A file's name is any bytes (undecodable ones arrive as lone surrogates, which orjson refuses): shown
            # as the report shows names, escaped and bounded.
            orjson.dumps(
                {"trace": {"nodes": safe_text(args.trace_nodes), "pods": safe_text(args.trace_pods)}, **summary}
            )
        )
        sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
    else:
        _trace_report(result, caption, elapsed, sys.stdout)
    if args.html:
        from kubegpu.scheduler.html import write_html
        from kubegpu.scheduler.report import CurveView, simulation_report

        curve = CurveView(tuple(result.curve.points()), result.curve.at(100), caption, result.curve.unreached())
        write_html(simulation_report(engine, result.events, [args.trace_nodes, args.trace_pods], curve), args.html)
    if args.stats:
        _print_stats(len(nodes), result.pods, elapsed, latencies)
    return 0


def _trace_caption(args: argparse.Namespace, result: traces.ReplayResult, engine: Engine) -> str:
    what = (
        "timeline (pods leave at their deletion time)"
        if result.mode == "timeline"
        else f"FGD experiment (seed {result.seed}, no departures, inflated to {100 * (result.inflate or 0):.0f}% of "
        "the GPU capacity)"
    )
    return safe_text(
        f"{Path(args.trace_pods).name} on {Path(args.trace_nodes).name}: {result.nodes} nodes, {result.gpus} GPUs; "
        f"{what}; policy {engine.policy}"
    )


CURVE_STEP = 5  # percent of arrived share between two rows of the text curve


def _trace_report(result: traces.ReplayResult, caption: str, elapsed: float, out: IO[str]) -> None:
    write = out.write
    write(f"kubegpu simulate: {safe_text(caption)}, {elapsed:.2f}s\n")
    write(
        f"  {result.pods} pods arrived, {result.scheduled} scheduled, {result.failed} failed"
        + (f", {result.deleted} deleted" if result.mode == "timeline" else "")
        + "\n\nALLOCATION CURVE (GPU capacity allocated against GPU capacity asked for by the pods arrived)\n"
    )
    write(f"  {'ARRIVED':>8} {'ALLOCATED':>10}\n")
    for arrived, allocated in result.curve.points():
        if arrived % CURVE_STEP == 0:
            write(f"  {arrived:7d}% {allocated:9.1f}% {'#' * round(allocated / 2)}\n")
    full = result.curve.at(100)
    if full is None:
        write(f"  {result.curve.unreached()}\n")
    else:
        write(f"  allocated at arrived 100%: {full:.1f}%\n")
    reasons = Counter(str(e.get("reason")) for e in result.events if e["event"] == "unschedulable")
    if reasons:
        write("  failed pods by reason:\n")
        for reason, count in reasons.most_common(5):
            write(f"    {count:6d}  {safe_text(reason)}\n")


def _print_stats(nodes: int, pods: int, elapsed: float, latencies: list[float]) -> None:
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        orjson.dumps(
            {
                "nodes": nodes,
                "pod_documents": pods,
                "seconds": round(elapsed, 4),
                "pods_per_second": round(pods / elapsed, 1) if elapsed else None,
                "p50_ms": round(_percentile(latencies, 0.50) * 1000, 4),
                "p99_ms": round(_percentile(latencies, 0.99) * 1000, 4),
                "peak_rss_mib": round(peak_kib / 1024, 1),
            }
        ).decode(),
        file=sys.stderr,
    )


# The oldest generation's threshold while the document path or a trace replay runs (`young_collections_only`):
# never reached.
NO_FULL_COLLECTION = 1 << 30


@contextmanager
def young_collections_only() -> Iterator[None]:
    """Run the block with the cyclic collector's young generations only. What the document path builds (parsed
    documents, node records, placed pods) lives until the run ends, and the engine makes almost no cyclic garbage
    (147 unreachable objects found by one collection after a whole `benchmarks/simulate_bench.py` run with the
    collector off): each full collection walked every object built so far for nothing, nine or ten times a run and
    about a tenth of its time. A trace replay alike: its memos (answers per shape and node content, raw scores,
    placements, measures) grow to millions of objects, and on the openb experiment the collector's own rule made 11
    full passes that found 20 objects, 1.6-2.3 s of 8 s of CPU. Cycles dropped while a pod is processed are still
    collected young; the thresholds are given back afterwards, also to a caller that runs the simulator in its own
    process. `benchmarks/sharing_bench.py` replays under it too, so that it measures what the simulator does."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTION)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _run(args: argparse.Namespace) -> int:
    if args.trace_nodes or args.trace_pods:
        with young_collections_only():  # the engine's memos: millions of objects over a replay, none garbage
            return _run_trace(args)
    if not args.files:
        print("kubegpu simulate: give manifest FILEs, or a trace (--trace-nodes and --trace-pods)", file=sys.stderr)
        return 2
    with young_collections_only():
        return _run_documents(args)


def _run_documents(args: argparse.Namespace) -> int:
    """The document path: load every file, add the nodes, process the pods in order."""
    found: list[tuple[str, str, dict[str, Any]]] = []
    engine = _engine(args)
    if engine is None:
        return 2
    try:
        nodes, pods = load_documents([Path(f) for f in args.files], found, engine.plugins.qualifiers)
    except SimulationError as exc:
        print(f"kubegpu simulate: invalid input: {safe_text(str(exc))}", file=sys.stderr)  # names from the file
        return 2
    started = time.perf_counter()
    for info in nodes:
        engine.add_node(info)
    cluster = Cluster.load(engine, found)
    latencies: list[float] = []
    out = sys.stdout
    events: list[dict[str, Any]] = []
    try:
        if args.json:
            buffer = out.buffer
            chunk: list[bytes] = []
            for event in _process(engine, pods, latencies, cluster):
                if args.html:
                    events.append(event)
                chunk.append(orjson.dumps(event))
                if len(chunk) >= 1000:
                    buffer.write(b"\n".join(chunk) + b"\n")
                    chunk.clear()
            if chunk:
                buffer.write(b"\n".join(chunk) + b"\n")
            buffer.flush()
        else:
            events = list(_process(engine, pods, latencies, cluster))
    except SimulationError as exc:
        out.flush()
        print(f"kubegpu simulate: invalid input: {safe_text(str(exc))}", file=sys.stderr)  # names from the file
        return 2
    elapsed = time.perf_counter() - started
    if not args.json:
        _report(engine, events, out, elapsed)
    if args.html:
        from kubegpu.scheduler.html import write_html
        from kubegpu.scheduler.report import simulation_report

        write_html(simulation_report(engine, events, args.files), args.html)
    if args.stats:
        _print_stats(len(nodes), len(pods), elapsed, latencies)
    return 0


def _seed(text: str) -> int:
    """`--seed`: a whole number that the JSON summary can hold, and one order per number (Python's `random` seeds
    with the absolute value, so -5 replayed 5's order under another name)."""
    if not (text.isascii() and text.isdigit()):  # int() also reads `4_2`, `+42` and other scripts' digits as 42
        raise argparse.ArgumentTypeError(f"'{shorten(text, 40)}' is not a whole number of the digits 0-9")
    value = int(text)
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{shorten(text, 40)} is outside 0..2**64-1")
    return value


def add_simulate_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="schedule Node and Pod manifests offline with the real engine and plugins",
        description="Schedule Node and Pod manifests offline with the same engine and plugins as the scheduler. "
        "Nodes are added first; pods are processed in document order; a pod with metadata.deletionTimestamp "
        "deletes the earlier pod of that name. Or replay a GPU cluster trace in Alibaba's cluster-trace-gpu-v2023 "
        "(openb) CSV format and print its allocation curve.",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="YAML (multi-document) or JSON / JSON lines")
    trace = parser.add_argument_group("trace replay (instead of FILEs)")
    trace.add_argument(
        "--trace-nodes", metavar="NODES.csv", help="the trace's node list (sn,cpu_milli,memory_mib,gpu,model)"
    )
    trace.add_argument(
        "--trace-pods",
        metavar="PODS.csv",
        help="the trace's pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time)",
    )
    trace.add_argument(
        "--timeline",
        action="store_true",
        help="create and delete each pod at its trace times (default: the FGD experiment)",
    )
    trace.add_argument(
        "--inflate",
        type=float,
        default=1.3,
        metavar="X",
        help="the experiment: add copies of random trace pods until they ask for X x the GPU capacity (default 1.3)",
    )
    trace.add_argument(
        "--seed", type=_seed, default=42, help="the experiment: the arrival order's seed, 0..2**64-1 (default 42)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per pod document")
    parser.add_argument("--policy", choices=POLICIES, help="node preference (default binpack)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a KubeSchedulerConfiguration, one profile (kubescheduler.config.k8s.io v1beta1, v1beta2, v1beta3 or v1): "
        "score weights, plugins on and off",
    )
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report of the devices to FILE")
    parser.add_argument(
        "--stats", action="store_true", help="print throughput, p50/p99 decision latency and peak memory to stderr"
    )
    parser.set_defaults(func=run)
    return parser
