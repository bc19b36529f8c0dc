"""Which PodDisruptionBudget version kubegpu reads, chosen from the API server's discovery document: policy/v1 where
it is served (1.21 and later), else policy/v1beta1 (1.20; removed in 1.25), else none. The 1.20.2 document was
recorded from the API server the integration tests run; the 1.24 and 1.34 ones are in the shape those servers answer
(`/apis/policy`, an APIGroup), as listed by kubernetes' own discovery handlers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubegpu.kube.client import ApiError
from kubegpu.kube.discovery import choose, discover, served_versions
from kubegpu.scheduler.mirror import BUDGET_VERSIONS

FIXTURES = Path(__file__).parent.parent / "fixtures" / "discovery"


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    ("document", "chosen"),
    [("policy-1.20.2.json", "v1beta1"), ("policy-1.24.json", "v1"), ("policy-1.34.json", "v1")],
    ids=["1.20-serves-only-v1beta1", "1.24-serves-both", "1.34-serves-only-v1"],
)
def test_budgets_are_read_in_v1_where_served_else_v1beta1(document: str, chosen: str) -> None:
    assert choose(recorded(document), "policy", BUDGET_VERSIONS) == chosen


def test_the_group_list_at_apis_answers_the_same_as_the_group_document() -> None:
    groups = {"kind": "APIGroupList", "groups": [{"name": "apps", "versions": []}, recorded("policy-1.34.json")]}
    assert choose(groups, "policy", BUDGET_VERSIONS) == "v1"
    assert choose({"kind": "APIGroupList", "groups": [{"name": "apps"}]}, "policy", BUDGET_VERSIONS) is None


@pytest.mark.parametrize(
    "document",
    [
        {"kind": "APIGroup", "name": "policy", "versions": [{"groupVersion": "policy/v2", "version": "v2"}]},
        {"kind": "APIGroup", "name": "policy", "versions": "v1"},
        {"kind": "APIGroup", "name": "policy", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]},
        {"kind": "APIGroup", "name": "apps", "versions": [{"groupVersion": "policy/v1", "version": "v1"}]},
        [],
        None,
    ],
    ids=[
        "only-a-version-kubegpu-does-not-read",
        "versions-not-a-list",
        "another-groups-version",
        "another-group",
        "a-list",
        "nothing",
    ],
)
def test_a_server_serving_neither_version_or_an_odd_document_yields_none(document: Any) -> None:
    assert choose(document, "policy", BUDGET_VERSIONS) is None


def test_served_versions_keep_the_servers_order() -> None:
    assert served_versions(recorded("policy-1.24.json"), "policy") == ["v1", "v1beta1"]


class Discovery:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def get(self, path: str, **_params: Any) -> Any:
        self.asked.append(path)
        if isinstance(self.answer, ApiError):
            raise self.answer
        return self.answer


def test_discover_asks_the_groups_document_and_a_404_means_the_group_is_not_served() -> None:
    client = Discovery(recorded("policy-1.34.json"))
    assert discover(client, "policy", BUDGET_VERSIONS) == "v1"  # type: ignore[arg-type]
    assert client.asked == ["/apis/policy"]
    assert discover(Discovery(ApiError(404, "NotFound", "")), "policy", BUDGET_VERSIONS) is None  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        discover(Discovery(ApiError(503, "ServiceUnavailable", "")), "policy", BUDGET_VERSIONS)  # type: ignore[arg-type]
