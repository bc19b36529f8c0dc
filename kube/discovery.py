"""Which version of an API group the API server serves, read from its discovery documents.

Kubernetes removes beta versions a few releases after the stable one arrives: PodDisruptionBudgets are served as
`policy/v1beta1` up to 1.24 and as `policy/v1` from 1.21, so an informer pinned to one version fails for ever on part
of the clusters people run (1.20 serves only v1beta1; 1.25 and later only v1). A front-end asks here which of the
versions it can read the server serves, in its order of preference, and watches that one.

`choose` is pure (a discovery document in, a version out) and reads both shapes the API server answers: `/apis/<group>`
(an `APIGroup`) and `/apis` (an `APIGroupList`). `discover` fetches `/apis/<group>`; a 404 means the group is not
served at all.

The server's own version (`/version`) is judged too (`version_verdict`): kubegpu is verified against Kubernetes 1.20
to 1.35 (the README's table). An older server is refused: kubegpu exits with a message naming the version, since
the APIs and fields it relies on may be missing or shaped otherwise. A newer one is served with a warning (a log
line, and `/readyz` lists it): refusing would stop scheduling on every cluster upgrade, and discovery still picks the
newest version kubegpu knows of each API.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.kube.client import ApiError, KubeClient

__all__ = [
    "NEWEST",
    "OLDEST",
    "ServerVersion",
    "choose",
    "discover",
    "events_api",
    "served_versions",
    "server_version",
    "version_verdict",
]

OLDEST, NEWEST = (1, 20), (1, 35)  # the Kubernetes minors kubegpu is verified against
EVENTS_GROUP = "events.k8s.io"


def served_versions(document: Any, group: str) -> list[str]:
    """The versions of `group` a discovery document lists (`APIGroup` or `APIGroupList`), in its order; a document
    of another shape lists none."""
    if not isinstance(document, Mapping):
        return []
    if document.get("kind") == "APIGroupList" or "groups" in document:
        groups = document.get("groups")
        entries = groups if isinstance(groups, list) else []
        document = next((g for g in entries if isinstance(g, Mapping) and g.get("name") == group), {})
    if document.get("name") != group:
        return []
    versions = document.get("versions")
    found = []
    for entry in versions if isinstance(versions, list) else []:
        version = entry.get("version") if isinstance(entry, Mapping) else None
        if isinstance(version, str) and entry.get("groupVersion") == f"{group}/{version}":
            found.append(version)
    return found


def choose(document: Any, group: str, wanted: Sequence[str]) -> str | None:
    """The first of `wanted` (most preferred first) that the document says the server serves for `group`; None
    when it serves none of them."""
    served = set(served_versions(document, group))
    return next((version for version in wanted if version in served), None)


def discover(client: KubeClient, group: str, wanted: Sequence[str]) -> str | None:
    """Ask the API server which of `wanted` it serves for `group` (None: none of them, or not the group at all).
    Any failure other than a 404 raises `ApiError`, for the caller to retry."""
    try:
        document = client.get(f"/apis/{group}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return choose(document, group, wanted)


# ---------------------------------------------------------------------------------------------------------------
# The server's version
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerVersion:
    """`/version`'s major and minor (a provider's `27+` read as 27) and `gitVersion` as the server states it."""

    major: int
    minor: int
    git_version: str

    def __str__(self) -> str:
        return self.git_version or f"v{self.major}.{self.minor}"


_LEADING_NUMBER = re.compile(r"[0-9]{1,4}")


def server_version(document: Any) -> ServerVersion | None:
    """The version in a `/version` document (`version.Info`), or None when it states none kubegpu can read. A
    server emulating an older release (`emulationMajor`/`emulationMinor`, 1.31+) serves that release's APIs, so
    the emulated version is the one judged."""
    if not isinstance(document, Mapping):
        return None
    numbers: list[int] = []
    for fields in (("emulationMajor", "emulationMinor"), ("major", "minor")):
        found = [_LEADING_NUMBER.match(str(document.get(field) or "")) for field in fields]
        if all(found):
            numbers = [int(match.group()) for match in found if match]
            break
    if not numbers:
        return None
    git = document.get("gitVersion")
    git_version = git[:64] if isinstance(git, str) and git.isprintable() else ""
    return ServerVersion(numbers[0], numbers[1], git_version)


def version_verdict(version: ServerVersion) -> tuple[bool, str] | None:
    """None for a server kubegpu is verified against; else (refused, the sentence saying why): refused when older
    than 1.20, served with a warning when newer than 1.35."""
    where = (version.major, version.minor)
    if where < OLDEST:
        return True, (
            f"the API server is Kubernetes {version}, older than 1.{OLDEST[1]}, the oldest kubegpu supports; "
            f"upgrade the cluster or run a kubegpu release made for it"
        )
    if where > NEWEST:
        return False, (
            f"the API server is Kubernetes {version}, newer than 1.{NEWEST[1]}, the newest kubegpu is verified "
            "against; kubegpu goes on with the newest API versions it knows (see /readyz's apis)"
        )
    return None


def events_api(client: KubeClient) -> str:
    """The API kubegpu writes Events in: `events.k8s.io/v1` where served (1.19+, what kube-scheduler writes), else
    the core `v1`, which every server serves. Raises `ApiError` (other than a 404) for the caller to retry."""
    return f"{EVENTS_GROUP}/v1" if discover(client, EVENTS_GROUP, ("v1",)) else "v1"
