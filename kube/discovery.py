"""Which version of an API group the API server serves, read from its discovery documents.

Kubernetes removes beta versions a few releases after the stable one arrives: PodDisruptionBudgets are served as
`policy/v1beta1` up to 1.24 and as `policy/v1` from 1.21, so an informer pinned to one version fails for ever on part
of the clusters people run (1.20 serves only v1beta1; 1.25 and later only v1). A front-end asks here which of the
versions it can read the server serves, in its order of preference, and watches that one.

`choose` is pure (a discovery document in, a version out) and reads both shapes the API server answers: `/apis/<group>`
(an `APIGroup`) and `/apis` (an `APIGroupList`). `discover` fetches `/apis/<group>`; a 404 means the group is not
served at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.kube.client import ApiError, KubeClient

__all__ = ["choose", "discover", "served_versions"]


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
