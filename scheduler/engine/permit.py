"""The Permit extension point: after a pod's devices are reserved, may it be bound now?

Each rule (`framework.PermitPlugin`) answers APPROVE, WAIT (with a timeout) or REJECT (with a reason), as
kube-scheduler's Permit plugins do. A waiting pod keeps its reservation (`waiting`) until a rule lets it go
(`allow`, or a later pod's APPROVE naming it), it is rejected (`reject_waiting`), or its deadline passes
(`expire`); a rejected or expired pod's reservation is given back (`unreserve`: idempotent, only this very pod's).
Time is the caller's clock, passed in (`now`): the engine keeps none.

The built-in rule is Coscheduling (scheduler-plugins' Permit): a member of a gang (`podgroups`) waits until
`minMember` members of its gang hold reservations, and the member that completes the gang approves the others. At
most one gang is partly held at any time: a member of a second gang is refused rather than left waiting, so two
gangs competing for the same nodes never both hold part (the deadlock of scheduler-plugins issue #117). A gang whose
members all arrived is placed whole instead (`gangs.place_gang`), which holds nothing unless every member has a place.

The rules an embedder adds (`Engine(permits=...)`) are asked after it, guarded as the rules plugins add are: a rule
that raises, or answers what a `Verdict` may not hold (`permit_answer`), rejects only the pod it was asked about, with
a reason naming the rule, and the failure is counted and logged once per rule.
"""

from __future__ import annotations

import math
from typing import Any

from kubegpu.core.answers import WrongAnswer
from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import LabelSelector, PodRequest, Requirement
from kubegpu.core.plugin_manager import PLUGIN_ERRORS
from kubegpu.core.text import safe_text
from kubegpu.scheduler.engine.framework import PermitPlugin
from kubegpu.scheduler.engine.preempt import Preempting
from kubegpu.scheduler.engine.records import PermitAnswer, PermitCode, PodRecord, Verdict, Waiting
from kubegpu.scheduler.engine.rules import EMBEDDER
from kubegpu.scheduler.podgroups import KUEUE_GROUP_LABEL, POD_GROUP_LABEL, PodGroup, gang_key, kueue_group

COSCHEDULING = "Coscheduling"


def _kind(value: object) -> str:
    return f"{safe_text(repr(value), 60)} ({type(value).__name__})"


def permit_answer(answer: Any) -> Verdict:
    """A Permit rule's answer, checked: a `Verdict` whose code is a `PermitCode`, whose reason is text or None, whose
    WAIT lasts a finite number of seconds (None: none), and whose `release` is a tuple of pod keys."""
    if not isinstance(answer, Verdict):
        raise WrongAnswer(f"returned {_kind(answer)}; a Verdict is due")
    if not isinstance(answer.code, PermitCode):
        raise WrongAnswer(f"answered {_kind(answer.code)}; a PermitCode is due")
    if answer.reason is not None and not isinstance(answer.reason, str):
        raise WrongAnswer(f"gave a reason {_kind(answer.reason)}; a string or None is due")
    timeout = answer.timeout
    if answer.code is PermitCode.WAIT and timeout is not None:
        number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if not number or not 0 <= timeout < math.inf:
            raise WrongAnswer(f"asked to WAIT for {_kind(timeout)}; a number of seconds, 0 or more, is due")
    if not isinstance(answer.release, tuple) or not all(isinstance(key, str) for key in answer.release):
        raise WrongAnswer(f"asked for releasing {_kind(answer.release)}; a tuple of pod keys is due")
    return answer


class Permitting(Preempting):
    """The Permit stage, the gangs the engine knows, and their members that hold reservations."""

    # -- the gangs -----------------------------------------------------------------------------------------------

    def set_pod_group(self, group: PodGroup | None, key: str | None = None) -> None:
        """Record a PodGroup (`podgroups.pod_group`), or forget the one named `key` (`namespace/name`) when None."""
        if group is None:
            if key is not None:
                self.pod_groups.pop(key, None)
            return
        self.pod_groups[group.key] = group

    def gang_of(self, pod: PodRequest) -> PodGroup | None:
        """The gang a pod belongs to: its PodGroup when one is known, else what its Kueue labels say; None for a pod
        of no gang, or of a PodGroup not reported yet (kube-scheduler's coscheduling schedules such a pod alone,
        too). Raises `ManifestError` for a Kueue member whose labels are malformed."""
        key = gang_key(pod)
        if key is None:
            return None
        group = self.pod_groups.get(key)
        if group is not None:
            return group
        return kueue_group(pod)

    def gang_holders(self, group: PodGroup) -> list[str]:
        """The pods of the gang that hold resources (reserved, waiting at Permit, or bound), in placement order."""
        version = self._placed.version
        known = self._gang_holders.get(group.key)
        if known is not None and known[0] == version:
            return list(known[1])
        found: dict[str, None] = {}
        for label in (POD_GROUP_LABEL, KUEUE_GROUP_LABEL):
            selector = LabelSelector((Requirement(label, "In", (group.name,)),))
            for key in self._placed.selected((group.namespace,), selector):
                if gang_key(self.pods[key].request) == group.key:
                    found[key] = None
        if len(self._gang_holders) >= 4096:
            self._gang_holders.clear()
        self._gang_holders[group.key] = (version, tuple(found))
        return list(found)

    # -- Permit --------------------------------------------------------------------------------------------------

    def permit(self, pod: PodRequest, *, now: float) -> PermitAnswer:
        """Permit for a pod that holds a reservation (`reserve`, `schedule`, `place_gang`): APPROVE, WAIT until a
        deadline (the reservation kept), or REJECT (the reservation given back). `now`: the caller's clock, in
        seconds, against which deadlines count. A pod that holds no reservation is rejected and nothing changes."""
        held = self.pods.get(pod.key)
        if held is None or held.request.uid != pod.uid:
            return PermitAnswer(pod.key, PermitCode.REJECT, reason=f"pod {pod.key} holds no reservation")
        node = held.node
        verdicts = [(COSCHEDULING, self._coscheduling(pod))]
        verdicts.extend((rule.name, self._asked(rule, pod, node)) for rule in self._permits)
        timeout: float | None = None
        reasons: list[str] = []
        released: list[str] = []
        for name, verdict in verdicts:
            if verdict.code is PermitCode.REJECT:
                self._unwait(pod.key)
                self.unreserve(pod, node)
                reason = safe_text(f"{name}: {verdict.reason or 'rejected'}")
                return PermitAnswer(pod.key, PermitCode.REJECT, node, reason=reason)
            if verdict.code is PermitCode.WAIT:
                wait = verdict.timeout if verdict.timeout is not None else 0.0
                timeout = wait if timeout is None else min(timeout, wait)
                reasons.append(f"{name}: {verdict.reason or 'waiting'}")
            released.extend(verdict.release)
        if timeout is not None:
            reason = safe_text("; ".join(reasons))
            self._wait(Waiting(pod, node, now + timeout, reason))
            return PermitAnswer(pod.key, PermitCode.WAIT, node, reason=reason, deadline=now + timeout)
        self._unwait(pod.key)
        approved = tuple(key for key in dict.fromkeys(released) if key != pod.key and self.allow(key) is not None)
        return PermitAnswer(pod.key, PermitCode.APPROVE, node, approved=approved)

    def _asked(self, rule: PermitPlugin, pod: PodRequest, node: str) -> Verdict:
        """An embedder's rule (`Engine(permits=...)`), guarded as the rules plugins add are: one that raises or
        answers what a `Verdict` may not hold rejects this pod only (its reservation given back), with a reason
        naming the rule; the failure is counted (`embedder`, `rule <name> (permit)`) and logged once per rule."""
        try:
            return permit_answer(rule.permit(self, pod, node))
        except PLUGIN_ERRORS as exc:  # SystemExit too: a rule's library that exits must not end the scheduler
            where = f"rule {rule.name} (permit)"
            error = self.plugins.failed(EMBEDDER, where, exc)
            self.plugins.warn_once(EMBEDDER, where, f"{error} (counted; logged once per rule)")
            return Verdict(PermitCode.REJECT, f"the rule failed: {type(exc).__name__}: {exc}")

    def allow(self, key: str) -> Waiting | None:
        """Let a pod waiting at Permit go (bind it): its entry, or None when it was not waiting or no longer holds
        the reservation it waited with."""
        waiting = self._unwait(key)
        if waiting is None or not self._still_held(waiting):
            return None
        return waiting

    def release(self, key: str) -> PodRecord | None:
        """Forget a pod (`NodeCache.release`); one that was waiting at Permit waits no more: a deleted member's
        entry would otherwise stay until its gang's timeout, up to a week, one per deletion."""
        self._unwait(key)
        self.leaving.discard(key)
        return super().release(key)

    def remove_node(self, name: str) -> list[str]:
        """Remove a node (`NodeCache.remove_node`); the pods that waited at Permit there hold no place any more, so
        they wait no more (the front-end tries them again, beside their gang's other members)."""
        gone = super().remove_node(name)
        for key in gone:
            waiting = self.waiting.get(key)
            if waiting is not None and waiting.node == name:
                self._unwait(key)
        return gone

    def is_waiting(self, key: str) -> bool:
        """Whether the pod `key` waits at Permit, holding a reservation no Binding was written for."""
        return key in self.waiting

    def waiting_pod(self, key: str) -> PodRequest | None:
        """The pod `key` as it waits at Permit (its gang read from it), or None when it does not wait there."""
        waiting = self.waiting.get(key)
        return waiting.pod if waiting is not None else None

    def waiting_gangs(self) -> dict[str, tuple[str, ...]]:
        """The gangs with members waiting at Permit (at most one, with the built-in rule; more only where an
        embedder's rule makes a gang's members wait), each with the keys of those members."""
        return {gang: tuple(keys) for gang, keys in self._waiting_gangs.items() if gang is not None}

    def reject_waiting(self, key: str) -> Waiting | None:
        """Refuse a pod waiting at Permit: its reservation is given back. Its entry, or None when it was not
        waiting. Idempotent."""
        waiting = self._unwait(key)
        if waiting is None:
            return None
        self.unreserve(waiting.pod, waiting.node)
        return waiting

    def expire(self, now: float) -> list[Waiting]:
        """Refuse every pod waiting at Permit past its deadline (`now`, the caller's clock): each one's reservation
        is given back, and with it the reservations of its gang's other waiting members (a gang waits as one)."""
        due = [key for key, waiting in self.waiting.items() if waiting.deadline <= now]
        expired: list[Waiting] = []
        for key in due:
            waiting = self.waiting.get(key)
            if waiting is None:
                continue
            gang = gang_key(waiting.pod)
            keys = [key] if gang is None else list(self._waiting_gangs.get(gang, ()))
            for each in keys:
                if (gone := self.reject_waiting(each)) is not None:
                    expired.append(gone)
        return expired

    def _wait(self, waiting: Waiting) -> None:
        """Keep `waiting` (its pod's reservation held) in `waiting` and its gang's index."""
        key = waiting.pod.key
        self._unwait(key)
        self.waiting[key] = waiting
        self._waiting_gangs.setdefault(gang_key(waiting.pod), {})[key] = None

    def _unwait(self, key: str) -> Waiting | None:
        """Take the pod `key` out of `waiting` and its gang's index: its entry, None when it was not waiting."""
        waiting = self.waiting.pop(key, None)
        if waiting is not None:
            gang = gang_key(waiting.pod)
            keys = self._waiting_gangs.get(gang)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._waiting_gangs[gang]
        return waiting

    def _still_held(self, waiting: Waiting) -> bool:
        held = self.pods.get(waiting.pod.key)
        return held is not None and held.request.uid == waiting.pod.uid and held.node == waiting.node

    def _coscheduling(self, pod: PodRequest) -> Verdict:
        """The built-in Permit rule: a gang member waits until `minMember` members hold reservations; the member
        that completes the gang approves the waiting ones. Only one gang may be partly held at a time."""
        try:
            group = self.gang_of(pod)
        except ManifestError as exc:
            return Verdict(PermitCode.REJECT, str(exc))
        if group is None:
            return Verdict(PermitCode.APPROVE)
        holders = self.gang_holders(group)
        if len(holders) >= group.min_member:
            return Verdict(PermitCode.APPROVE, release=tuple(self._waiting_gangs.get(group.key, ())))
        # Another gang's members that no longer hold their reservations do not count; this gang's own waiting
        # members are not looked at (a gang of thousands would cost a pass over them per member).
        for gang in [g for g in self._waiting_gangs if g is not None and g != group.key]:
            for key in list(self._waiting_gangs[gang]):
                if not self._still_held(self.waiting[key]):
                    self._unwait(key)
        other = next((g for g in self._waiting_gangs if g is not None and g != group.key), None)
        if other is not None:
            return Verdict(
                PermitCode.REJECT,
                f"gang {group.key}: gang {other} is partly held; one gang waits at a time, so that two never "
                "both hold part",
            )
        return Verdict(
            PermitCode.WAIT,
            f"gang {group.key}: {len(holders)} of minMember {group.min_member} members hold places",
            timeout=float(group.timeout_seconds),
        )
