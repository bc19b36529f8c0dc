"""What the custom scheduler tells the owner of a gang: the PodGroup's `status` and the Events on it.

scheduler-plugins runs a controller beside its scheduler to keep a PodGroup's `status` (its phase and how many
members are scheduled, running, succeeded and failed); kubegpu runs none, so the custom scheduler keeps it, from
what its pod informer already reports. `GangMembers` indexes the members of every gang by state (read from the raw
pod: a label lookup for a pod of no gang, so the informer's hot path stays as it was); `phase` is the phase those
counts give, after the controller's rules; `GroupStatus` writes a group's status when it changes (a merge patch of
the status subresource, never the spec its owner writes) and an Event on the PodGroup once per distinct message.

A gang of Kueue's labels has no object to write on: its members alone carry its Events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.core.text import safe_text
from kubegpu.kube.client import ApiError, now_rfc3339
from kubegpu.scheduler.binder import Binder

__all__ = ["Counts", "GangMembers", "GroupStatus", "gang_of", "member_state", "phase"]

log = logging.getLogger("kubegpu.scheduler")

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
API = "scheduling.x-k8s.io/v1alpha1"
# A member's state, as the counts name them; "pending": not bound yet.
STATES = ("pending", "scheduled", "running", "succeeded", "failed")
MAX_MESSAGES = 4096  # gangs whose last Event message is remembered (one Event per distinct message)


@dataclass(frozen=True, slots=True)
class Counts:
    """A gang's members by state: `members` in all; `scheduled`, those bound to a node (whatever they did since)."""

    members: int = 0
    scheduled: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0


def gang_of(obj: Mapping[str, Any]) -> str | None:
    """`namespace/name` of the gang a raw pod names with its labels (coscheduling's first, then Kueue's); None."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels")
    if not labels:
        return None
    name = labels.get(POD_GROUP_LABEL) or labels.get(KUEUE_GROUP_LABEL)
    if not isinstance(name, str) or not name:
        return None
    return f"{meta.get('namespace', 'default')}/{name}"


def member_state(obj: Mapping[str, Any]) -> str:
    """A raw pod's state among `STATES`: its phase once it succeeded, failed or runs; else bound or pending."""
    phase_ = (obj.get("status") or {}).get("phase")
    if phase_ == "Succeeded":
        return "succeeded"
    if phase_ == "Failed":
        return "failed"
    if not (obj.get("spec") or {}).get("nodeName"):
        return "pending"
    return "running" if phase_ == "Running" else "scheduled"


def phase(min_member: int, counts: Counts) -> str:
    """The phase scheduler-plugins' PodGroup controller gives these counts: Pending (fewer than `min_member`
    members exist), PreScheduling (enough exist, none bound), Scheduling (some bound, fewer than `min_member`),
    Scheduled, Running (`min_member` running or done), Finished (`min_member` succeeded), Failed (a member failed
    and the gang cannot go on without it)."""
    done = counts.running + counts.succeeded
    if counts.failed and done + counts.failed >= min_member and done < min_member:
        return "Failed"
    if counts.succeeded >= min_member:
        return "Finished"
    if done >= min_member:
        return "Running"
    if counts.scheduled >= min_member:
        return "Scheduled"
    if counts.scheduled:
        return "Scheduling"
    return "PreScheduling" if counts.members >= min_member else "Pending"


class GangMembers:
    """Every gang's members by state, from the pod informer (`observe`), and the gangs whose counts changed since
    they were last read (`take_changed`)."""

    def __init__(self) -> None:
        self._members: dict[str, dict[str, str]] = {}  # gang -> pod key -> state
        self._gang: dict[str, str] = {}  # pod key -> its gang
        self._changed: set[str] = set()

    def observe(self, key: str, gang: str | None, state: str | None) -> None:
        """The pod `key` is now a member of `gang` in `state` (either None: of no gang, or gone)."""
        before = self._gang.get(key)
        if before is not None and (before != gang or state is None):
            members = self._members[before]
            del members[key], self._gang[key]
            if not members:
                del self._members[before]
            self._changed.add(before)
        if gang is None or state is None:
            return
        members = self._members.setdefault(gang, {})
        if members.get(key) != state:
            members[key] = state
            self._gang[key] = gang
            self._changed.add(gang)

    def __contains__(self, key: object) -> bool:
        return key in self._gang

    def keep_only(self, live: set[str]) -> None:
        """After a relist: only these pods exist."""
        for key in [k for k in self._gang if k not in live]:
            self.observe(key, None, None)

    def counts(self, gang: str) -> Counts:
        members = self._members.get(gang) or {}
        by_state = dict.fromkeys(STATES, 0)
        for state in members.values():
            by_state[state] += 1
        bound = len(members) - by_state["pending"]
        return Counts(len(members), bound, by_state["running"], by_state["succeeded"], by_state["failed"])

    def members(self, gang: str) -> dict[str, str]:
        """The gang's members (pod key -> state); read-only."""
        return self._members.get(gang) or {}

    def touch(self, gang: str) -> None:
        """Count `gang` as changed: its PodGroup was made (again), and its status is due on it."""
        self._changed.add(gang)

    def take_changed(self) -> set[str]:
        changed, self._changed = self._changed, set()
        return changed


class GroupStatus:
    """Writes the PodGroups' status and Events through the binder's writer; `group_of(key)` is what is known of the
    PodGroup `key` (its uid and `minMember`; None when it does not exist or cannot be read); `uid_of(key)` its uid
    whenever it exists, read or not (a PodGroup kubegpu cannot read is told why on itself)."""

    def __init__(
        self,
        binder: Binder,
        group_of: Callable[[str], tuple[str, int] | None],
        uid_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.binder = binder
        self.group_of = group_of
        self.uid_of = uid_of or (lambda key: None if (known := group_of(key)) is None else known[0])
        # gang -> (the PodGroup's uid, the status last written on it): never written twice on one PodGroup.
        self._written: dict[str, tuple[str, dict[str, Any]]] = {}
        self._started: dict[str, str] = {}  # gang -> when the scheduler first tried it (scheduleStartTime)
        self._said: dict[str, tuple[str, str]] = {}  # gang -> (the PodGroup's uid, the last Event message on it)

    def tried(self, gang: str) -> None:
        """The scheduler tried to place the gang (its `scheduleStartTime`, once)."""
        self._started.setdefault(gang, now_rfc3339())

    def update(self, gang: str, counts: Counts) -> None:
        """Write the gang's status if it differs from what was last written; a Normal Event when it is placed."""
        known = self.group_of(gang)
        if known is None:
            self._written.pop(gang, None)
            return
        uid, min_member = known
        status: dict[str, Any] = {
            "phase": phase(min_member, counts),
            "scheduled": counts.scheduled,
            "running": counts.running,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
        }
        if gang in self._started:
            status["scheduleStartTime"] = self._started[gang]
        written = self._written.get(gang)
        before = written[1] if written is not None and written[0] == uid else None
        if before == status:
            return
        self._written[gang] = (uid, status)
        namespace, name = gang.split("/", 1)
        self.binder.submit(self._patch(namespace, name, status))
        if status["phase"] == "Scheduled" and (before or {}).get("phase") != "Scheduled":
            self.event(gang, "Scheduled", f"{counts.scheduled} members bound (minMember {min_member})", "Normal")

    def event(self, gang: str, reason: str, message: str, kind: str = "Warning") -> None:
        """An Event on the PodGroup, unless the last one written on it said the same."""
        uid = self.uid_of(gang)
        message = safe_text(message)
        if uid is None or self._said.get(gang) == (uid, message):
            return
        if len(self._said) >= MAX_MESSAGES:
            self._said.clear()
        self._said[gang] = (uid, message)
        namespace, name = gang.split("/", 1)
        involved = {"apiVersion": API, "kind": "PodGroup", "name": name, "namespace": namespace, "uid": uid}
        self.binder.submit(self.binder.post_object_event(involved, reason, message, kind))

    def forget(self, gang: str) -> None:
        for table in (self._written, self._started, self._said):
            table.pop(gang, None)

    async def _patch(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = f"/apis/{API}/namespaces/{namespace}/podgroups/{name}/status"
        try:
            await self.binder.writer.patch(path, {"status": status})
        except ApiError as exc:
            level = logging.DEBUG if exc.status == 404 else logging.WARNING
            log.log(level, "could not write the PodGroup's status: %s", exc, extra={"pod": f"{namespace}/{name}"})
