"""The checked boundary: every answer a plugin gives is held against its hook's contract before kubegpu uses it.

A plugin is third-party code. An exception it raises is one way to fail; an answer of the wrong kind is another, and
a quieter one: `fit` returning `True`, `score` returning `"high"`, `resources` returning a string (which would claim
the resources `a`, `m`, `d`), an allocation naming another plugin's resource or a container the pod does not have.
Without a check such answers crash a front-end far from the plugin, or are signed and written. The plugin manager
runs the check of each hook (`CHECKS`) on every answer; a violation raises `WrongAnswer`, which the manager wraps in
`PluginHookError` naming the plugin and the hook, exactly like an exception, so every front-end isolates it the same
way.

A check returns the answer to use: the answer itself, or a corrected copy where the contract allows a correction (an
allocation or an inventory naming a plugin other than the entry-point name is renamed, with a warning once; `None`
from `resources` is an empty list; `None` from `release` is a success). The checks are cheap on the hot path: an
`isinstance` for a `Status`, a few comparisons for a `Headroom`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pydantic import ValidationError

from kubegpu.core.annotations import MAX_ANNOTATION_BYTES, unreadable
from kubegpu.core.errors import describe_validation_error, shorten
from kubegpu.core.limits import MAX_DEVICES_PER_NODE
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceInventory,
    DeviceOwnership,
    Occupancy,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom
from kubegpu.core.status import Code, Status

__all__ = [
    "CHECKS",
    "RESERVED_ANNOTATION_PREFIX",
    "Router",
    "WrongAnswer",
    "rule_filter_answer",
    "rule_score_answer",
]

log = logging.getLogger("kubegpu.plugins")

RESERVED_ANNOTATION_PREFIX = "kubegpu.io/"  # pod annotations kubegpu writes itself (the signed allocation)


class WrongAnswer(TypeError):
    """A plugin's answer breaks its hook's contract; the message says what was returned and what is due."""


class Router(Protocol):
    """What a check needs from the plugin manager: who owns a resource, and a place to remember warnings."""

    def owner_of(self, resource: str) -> str | None: ...

    def warn_once(self, plugin: str, topic: str, message: str) -> None: ...


Check = Callable[[Router, str, Any, Mapping[str, Any]], Any]


def _kind(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- shared ---------------------------------------------------------------------------------------------------------


def _resources(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> list[str]:
    if answer is None:
        return []
    if isinstance(answer, str):
        raise WrongAnswer(
            f"returned the string {answer!r}; a list of resource names is due (a string would claim each of its "
            "characters)"
        )
    if not isinstance(answer, (list, tuple)):
        raise WrongAnswer(f"returned {_kind(answer)}; a list of resource names is due")
    for resource in answer:
        if not isinstance(resource, str) or not resource or resource != resource.strip():
            raise WrongAnswer(f"named {_kind(resource)} among its resources; each must be a resource name")
    return list(answer)


def _status(hook_answer: str, *, none_ok: bool) -> Check:
    def check(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
        if answer.__class__ is not Status and isinstance(answer, Status):
            # A subclass may compute its fields on every read, past this check: the engine gets the plain Status
            # it reads as now (its reasons as plain text).
            answer = Status(answer.code, tuple(map(str, answer.reasons)), answer.plugin)
        if answer.__class__ is Status:
            if answer.code.__class__ is not Code:
                raise WrongAnswer(
                    f"returned a Status whose code is {_kind(answer.code)}; a Code is due ({hook_answer})"
                )
            return answer
        if answer is None and none_ok:
            return None
        due = "a Status or None" if none_ok else "a Status"
        raise WrongAnswer(f"returned {_kind(answer)}; {due} is due ({hook_answer})")

    return check


def _owned(manager: Router, plugin: str, resource: str) -> bool:
    return manager.owner_of(resource) == plugin


MAX_QUALIFIERS = 64  # resources one plugin may declare qualifiers: a declaration is read once, kept for good


def _qualifiers(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> dict[str, str]:
    if answer is None:
        return {}
    if not isinstance(answer, Mapping):
        raise WrongAnswer(f"returned {_kind(answer)}; a mapping of qualifying resource -> qualified resource is due")
    if len(answer) > MAX_QUALIFIERS:
        raise WrongAnswer(f"declared {len(answer)} qualifiers; at most {MAX_QUALIFIERS} are read")
    declared: dict[str, str] = {}
    for qualifier, qualified in answer.items():
        for resource in (qualifier, qualified):
            if resource.__class__ is not str or not resource or resource != resource.strip():
                raise WrongAnswer(f"named {_kind(resource)} among its qualifiers; each must be a resource name")
            if not _owned(manager, plugin, resource):
                raise WrongAnswer(
                    f"declared {shorten(resource)!r}, which it does not own, in a qualifier; a plugin declares "
                    "qualifiers among its own resources (kubegpu_scheduler_resources)"
                )
        if qualifier == qualified:
            raise WrongAnswer(f"declared {shorten(qualifier)!r} a qualifier of itself")
        declared[qualifier] = qualified
    chained = next((q for q in declared.values() if q in declared), None)
    if chained is not None:
        raise WrongAnswer(
            f"declared {shorten(chained)!r} both qualified and a qualifier; a qualifier qualifies a device alone"
        )
    return declared


# -- scheduler side -------------------------------------------------------------------------------------------------


def _build_node(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None or isinstance(answer, DeviceNodeState):
        return answer
    raise WrongAnswer(f"returned {_kind(answer)}; a DeviceNodeState (subclass) or None is due")


def _headroom(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, Headroom):
        raise WrongAnswer(f"returned {_kind(answer)}; a Headroom(free={{resource: int}}, utilization=0..1) is due")
    if not isinstance(answer.free, dict):
        raise WrongAnswer(f"returned a Headroom whose free is {_kind(answer.free)}; a dict resource -> int is due")
    for resource, amount in answer.free.items():
        if not isinstance(resource, str) or not _is_int(amount) or amount < 0:
            raise WrongAnswer(
                f"returned a Headroom with free[{resource!r}] = {_kind(amount)}; a whole number >= 0 is due"
            )
        if not _owned(manager, plugin, resource):
            raise WrongAnswer(f"returned a Headroom naming {resource!r}, which plugin {plugin!r} does not own")
    unlisted = answer.unlisted
    if not isinstance(unlisted, frozenset) or not all(isinstance(r, str) for r in unlisted):
        raise WrongAnswer(f"returned a Headroom whose unlisted is {_kind(unlisted)}; a frozenset of resources is due")
    for resource in unlisted:
        if not _owned(manager, plugin, resource):
            raise WrongAnswer(f"returned a Headroom naming {resource!r}, which plugin {plugin!r} does not own")
    utilization = answer.utilization
    if not _is_number(utilization) or not 0.0 <= utilization <= 1.0:  # NaN fails both comparisons
        raise WrongAnswer(f"returned a Headroom with utilization {_kind(utilization)}; a number in [0, 1] is due")
    return answer


_ANNOTATION_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _annotation_key(key: str) -> bool:
    """Whether the API server takes `key` as an annotation key: a qualified name, `[prefix/]name`, read as the API
    server reads an annotation's, in lower case (`Example.COM/Key` is taken; a '/' needs a prefix before it)."""
    prefix, slash, name = key.lower().rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return _ANNOTATION_NAME.fullmatch(name) is not None


_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _label_key(key: str) -> bool:
    """Whether the API server takes `key` as a label key: `[prefix/]name`, as it is (a label key is not read in
    lower case as an annotation's is: `Example.COM/x` is refused)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return _ANNOTATION_NAME.fullmatch(name) is not None


RULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _rules(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> list[Any]:
    if answer is None:
        return []
    if not isinstance(answer, (list, tuple)):
        raise WrongAnswer(f"returned {_kind(answer)}; a list of rule objects is due")
    for rule in answer:
        name = getattr(rule, "name", None)
        if not isinstance(name, str) or not RULE_NAME.fullmatch(name):
            raise WrongAnswer(
                f"returned a rule named {_kind(name)}; each rule needs a name of letters, digits, '-', '_', '.' "
                "(at most 63)"
            )
        if not callable(getattr(rule, "filter", None)) and not callable(getattr(rule, "score", None)):
            raise WrongAnswer(f"returned the rule {name!r} with neither a filter nor a score method")
    return list(answer)


def rule_filter_answer(answer: Any) -> Status | None:
    """A `FilterRule.filter` answer, checked: None or a `Status`."""
    if answer is None or isinstance(answer, Status):
        return answer
    raise WrongAnswer(f"returned {_kind(answer)}; None or a Status is due")


def rule_score_answer(answer: Any) -> float:
    """A `ScoreRule.score` answer, checked: a number in [0, 100], None read as 0."""
    if answer is None:
        return 0.0
    if not _is_number(answer) or not math.isfinite(answer) or not 0 <= answer <= 100:
        raise WrongAnswer(f"returned {_kind(answer)}; a number in [0, 100] (or None) is due")
    return float(answer)


def _score(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    number = _plain_number(answer)
    if number is None or not math.isfinite(number) or not 0 <= number <= 100:
        raise WrongAnswer(f"returned {_kind(answer)}; a number in [0, 100] (or None) is due")
    return number


def _fragmentation(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    number = _plain_number(answer)
    if number is None or not math.isfinite(number):
        raise WrongAnswer(f"returned {_kind(answer)}; a finite number of devices (or None) is due")
    return number


def _plain_number(answer: object) -> int | float | None:
    """`answer` as a plain int or float, None when it is no number: a subclass may compute on every use (its truth,
    its comparisons) past the check, so the engine gets the float it converts to, and the check compares that."""
    if answer.__class__ is float or answer.__class__ is int:
        return answer
    return float(answer) if _is_number(answer) else None  # type: ignore[arg-type]  # an int or float subclass


def _epoch(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None or answer.__class__ is int:
        return answer
    if isinstance(answer, int) and not isinstance(answer, bool):
        return int(answer)  # a subclass may compute on every comparison with the epoch remembered: the plain int
    raise WrongAnswer(f"returned {_kind(answer)}; a whole number (or None) is due")


def _node_digest(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    try:
        hash(answer)
    except Exception:  # a plugin's own __hash__ may raise anything: its failure, named
        raise WrongAnswer(f"returned {_kind(answer)}, which is not hashable; a hashable value or None is due") from None
    return answer


def _allocation(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, PluginAllocation):
        raise WrongAnswer(f"returned {_kind(answer)}; a PluginAllocation or None is due")
    pod: PodRequest | None = kwargs.get("pod")
    _check_allocation(manager, plugin, answer, {c.name for c in pod.containers} if pod is not None else None)
    written = 0
    for key, value in answer.annotations.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise WrongAnswer(f"returned an allocation with annotation {_kind(key)}: {_kind(value)}; strings are due")
        if key.startswith(RESERVED_ANNOTATION_PREFIX):
            raise WrongAnswer(f"returned an allocation writing the annotation {key!r}: kubegpu.io/ keys are kubegpu's")
        if not _annotation_key(key):
            raise WrongAnswer(
                f"returned an allocation writing the annotation {shorten(key)!r}, which the API server refuses: a key "
                "is a name of at most 63 letters, digits, '-', '_', '.' (alphanumeric at both ends), after an optional "
                "non-empty DNS subdomain prefix and '/'"
            )
        # Written as they are, in UTF-8 (the client's orjson cannot write a lone surrogate): counted so.
        try:
            written += len(key) + len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise WrongAnswer(
                f"returned an allocation writing the annotation {key!r} with text that is not UTF-8 (a lone "
                "surrogate), which cannot be written on the pod"
            ) from None
    if written > MAX_ANNOTATION_BYTES:
        raise WrongAnswer(
            f"returned annotations of {written} bytes, more than the {MAX_ANNOTATION_BYTES} the API server allows "
            "for all of a pod's annotations"
        )
    # What goes into the pod's allocation must be writable (the API server's limit on a pod's annotations) and
    # readable by the node side's decoder (its depth, integer and text limits): else the pod is bound, then refused
    # on its node. The whole of what is written, every plugin's part together, is measured again once merged and
    # signed (`Reserving`).
    problem = unreadable({"containers": answer.containers, "shares": answer.shares, "plugins": {plugin: answer.fields}})
    if problem is not None:
        raise WrongAnswer(f"returned an allocation that cannot be written on the pod and read on its node: {problem}")
    if answer.plugin != plugin:
        manager.warn_once(
            plugin,
            "allocation-name",
            f"plugin {plugin!r} names its allocations {answer.plugin!r}; kubegpu uses the entry-point name "
            f"{plugin!r} (set PluginAllocation.plugin to it)",
        )
        answer = answer.model_copy(update={"plugin": plugin})
    return answer


def _check_allocation(manager: Router, plugin: str, answer: PluginAllocation, containers: set[str] | None) -> None:
    if not isinstance(answer.containers, dict):
        raise WrongAnswer(f"returned an allocation whose containers are {_kind(answer.containers)}; a dict is due")
    for container, resources in answer.containers.items():
        if containers is not None and container not in containers:
            raise WrongAnswer(f"allocated devices to container {container!r}, which the pod does not have")
        if not isinstance(resources, dict):
            raise WrongAnswer(f"allocated {_kind(resources)} to container {container!r}; resource -> ids is due")
        for resource, ids in resources.items():
            if not isinstance(resource, str) or not _owned(manager, plugin, resource):
                raise WrongAnswer(
                    f"allocated {resource!r} to container {container!r}: plugin {plugin!r} does not own that resource"
                )
            if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
                raise WrongAnswer(f"allocated {_kind(ids)} as {resource} of {container!r}; a list of id strings is due")
            if len(set(ids)) != len(ids):
                raise WrongAnswer(f"allocated one device twice as {resource} of {container!r}: {ids}")
    if not isinstance(answer.shares, dict):
        raise WrongAnswer(f"returned an allocation whose shares are {_kind(answer.shares)}; a dict is due")
    for container, by_resource in answer.shares.items():
        listed = answer.containers.get(container)
        if listed is None or not isinstance(by_resource, dict):
            raise WrongAnswer(f"gave shares to container {container!r} but allocated it no devices")
        for resource, amounts in by_resource.items():
            if resource not in listed or not isinstance(amounts, dict):
                raise WrongAnswer(f"gave shares of {resource!r} to {container!r} without listing its devices")
            for device, amount in amounts.items():
                if device not in listed[resource] or not _is_int(amount) or amount < 0:
                    raise WrongAnswer(
                        f"gave {container!r} a share {_kind(amount)} of {resource} on {device!r}; a whole number "
                        "on a listed device is due"
                    )
    try:
        json.dumps(answer.fields, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise WrongAnswer(f"returned allocation fields that are not JSON ({exc}); they go into an annotation") from None


def _describe(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, list) or not all(isinstance(o, Occupancy) for o in answer):
        raise WrongAnswer(f"returned {_kind(answer)}; a list of Occupancy is due")
    for occupancy in answer:
        # Reports draw every cell: a picture of more devices than kubegpu handles is refused, not drawn.
        count = max(len(occupancy.cells), occupancy.total if _is_int(occupancy.total) else 0)
        if count > MAX_DEVICES_PER_NODE:
            raise WrongAnswer(
                f"described {count} devices; kubegpu handles at most {MAX_DEVICES_PER_NODE} devices of one kind per "
                "node (kubegpu.core.limits)"
            )
        for cell in occupancy.cells:
            holders = set(cell.holders) if cell.shares else ()  # a set: a cell of 10,000 sharers is one pass
            for holder, part in cell.shares.items():
                if holder not in holders or not 0.0 <= part <= 1.0:  # NaN too
                    raise WrongAnswer(
                        f"described device {shorten(cell.id)!r} with a share of {part!r} for {shorten(holder)!r}; "
                        "each share is a fraction of the device from 0 to 1, of one of the cell's holders"
                    )
    return answer


def _release(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return Status.success()
    if isinstance(answer, Status):
        if not answer.ok:
            manager.warn_once(
                plugin,
                "release-idempotent",
                f"plugin {plugin!r} refused a release ({answer.message}): deprecated since release became idempotent "
                "(Kubernetes' Unreserve); answer success for what the pod no longer holds",
            )
        return answer
    raise WrongAnswer(
        f"returned {_kind(answer)}; a Status is due (release is idempotent: success when nothing is held)"
    )


# -- device side ----------------------------------------------------------------------------------------------------


def _owned_answer(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None or isinstance(answer, DeviceOwnership):
        return answer
    raise WrongAnswer(f"returned {_kind(answer)}; a DeviceOwnership or None is due")


def _discover(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, DeviceInventory):
        raise WrongAnswer(f"returned {_kind(answer)}; a DeviceInventory or None is due")
    if answer.plugin != plugin:
        manager.warn_once(
            plugin,
            "inventory-name",
            f"plugin {plugin!r} names its inventory {answer.plugin!r}; it is published under the entry-point name",
        )
        answer = answer.model_copy(update={"plugin": plugin})
    return answer


def _health(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, dict) or not all(isinstance(k, str) and isinstance(v, bool) for k, v in answer.items()):
        raise WrongAnswer(f"returned {_kind(answer)}; a dict device id -> bool (or None) is due")
    return answer


def _advertise(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, Advertisement):
        raise WrongAnswer(f"returned {_kind(answer)}; an Advertisement or None is due")
    try:
        checked = Advertisement.model_validate(answer.model_dump(warnings=False), strict=True)
    except ValidationError as exc:
        raise WrongAnswer(
            f"returned an invalid Advertisement: {describe_validation_error(exc, 'advertisement')}"
        ) from None
    for resource, count in checked.capacity.items():
        if count < 0 or not _owned(manager, plugin, resource):
            raise WrongAnswer(f"advertised {resource}: {count}; only resources it owns, in counts >= 0")
    # The advertiser patches every plugin's labels in one request with the node's `kubegpu.io/devices` annotation:
    # one label the API server refuses would cost every plugin's inventory on the node, not this plugin's labels.
    for key, value in checked.labels.items():
        if not _label_key(key) or not _LABEL_VALUE.fullmatch(value):
            raise WrongAnswer(
                f"advertised the label {shorten(key)!r}: {shorten(value)!r}, which the API server refuses: a key is "
                "[prefix/]name (a lower-case DNS subdomain prefix, a name of at most 63 letters, digits, '-', '_', "
                "'.'), a value at most 63 of those, beginning and ending with a letter or digit, or empty"
            )
    return checked


def _plugin_ids(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None:
        return None
    if not isinstance(answer, dict):
        raise WrongAnswer(f"returned {_kind(answer)}; a dict resource -> {{device id: healthy}} is due")
    for resource, devices in answer.items():
        if not isinstance(resource, str) or not _owned(manager, plugin, resource):
            raise WrongAnswer(f"named ids for {resource!r}, which plugin {plugin!r} does not own")
        if not isinstance(devices, dict) or not all(
            isinstance(k, str) and isinstance(v, bool) for k, v in devices.items()
        ):
            raise WrongAnswer(f"named {_kind(devices)} for {resource}; a dict device id -> bool is due")
    return answer


def _edit_container(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is not None and not isinstance(answer, bool):
        raise WrongAnswer(f"returned {_kind(answer)}; True (edited) or None (not its allocation) is due")
    edit = kwargs.get("edit")
    if isinstance(edit, ContainerEdit):
        try:
            ContainerEdit.model_validate(edit.model_dump(warnings=False))
        except ValidationError as exc:
            raise WrongAnswer(f"left an invalid container config: {describe_validation_error(exc, 'edit')}") from None
    allocation = kwargs.get("allocation")
    if (
        answer is not True
        and isinstance(allocation, ContainerAllocation)
        and allocation.resources
        and all(_owned(manager, plugin, r) for r in allocation.resources)
    ):
        raise WrongAnswer(
            f"returned {answer!r} for an allocation of its own resources ({', '.join(sorted(allocation.resources))}); "
            "True is due once the container has its devices"
        )
    return answer


def _forget_pods(manager: Router, plugin: str, answer: Any, kwargs: Mapping[str, Any]) -> Any:
    if answer is None or (_is_int(answer) and answer >= 0):
        return answer
    raise WrongAnswer(f"returned {_kind(answer)}; how many pods' leftovers were removed (an int >= 0) or None is due")


CHECKS: dict[str, Check] = {
    "kubegpu_scheduler_resources": _resources,
    "kubegpu_scheduler_qualifiers": _qualifiers,
    "kubegpu_scheduler_build_node": _build_node,
    "kubegpu_scheduler_node_digest": _node_digest,
    "kubegpu_scheduler_headroom": _headroom,
    "kubegpu_scheduler_validate": _status("None or a success when the request is well formed", none_ok=True),
    "kubegpu_scheduler_fit": _status("success, or why the pod does not fit", none_ok=False),
    "kubegpu_scheduler_score": _score,
    "kubegpu_scheduler_fragmentation": _fragmentation,
    "kubegpu_scheduler_fragmentation_epoch": _epoch,
    "kubegpu_scheduler_allocate": _allocation,
    "kubegpu_scheduler_take": _status("success, or an error naming the device", none_ok=False),
    "kubegpu_scheduler_release": _release,
    "kubegpu_scheduler_rules": _rules,
    "kubegpu_scheduler_describe": _describe,
    "kubegpu_device_resources": _resources,
    "kubegpu_device_owned": _owned_answer,
    "kubegpu_device_discover": _discover,
    "kubegpu_device_health": _health,
    "kubegpu_device_advertise": _advertise,
    "kubegpu_device_plugin_ids": _plugin_ids,
    "kubegpu_device_edit_container": _edit_container,
    "kubegpu_device_forget_pods": _forget_pods,
}
