"""A device plugin state's `scoring_content()` (`kubegpu.core.kit`): what the engine's local scores read of a node,
so that nodes alike share one computation of their scores. The kit invites a plugin whose scores read more of its
state to override it; one that answers what cannot be a key (a list of its holders) or raises costs its own nodes
their shared computation, never the cycle: each such node is scored alone, and the log names the plugin. A
`SystemExit` too, as in the plugin's hooks (T105): it ended `Engine.schedule`, and the scheduler, at the first pod."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kubegpu.core import scheduler_hooks
from kubegpu.core.kit import WholeDeviceNodeState, WholeDevicePlugin, label_devices
from kubegpu.core.models import DeviceInfo, NodeInfo
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine

CARD = "cards.example/card"


class ListingHolders(WholeDeviceNodeState):
    __slots__ = ()

    def scoring_content(self) -> tuple[object, ...]:
        return (*super().scoring_content(), list(self.holders))  # a list: no key


class Failing(WholeDeviceNodeState):
    __slots__ = ()

    def scoring_content(self) -> tuple[object, ...]:
        raise RuntimeError("holders not loaded yet")


class Exiting(WholeDeviceNodeState):
    """A plugin that parses its settings with argparse on first use: its error is `SystemExit` (T105)."""

    __slots__ = ()

    def scoring_content(self) -> tuple[object, ...]:
        raise SystemExit(2)


class Overriding(WholeDevicePlugin):
    """Interchangeable cards from the label `cards.example/card.count`, whose states answer `scoring_content` as
    `kind` does."""

    resources = (CARD,)

    def __init__(self, kind: type[WholeDeviceNodeState]) -> None:
        self.kind = kind

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], None] | None:
        return label_devices(node.labels, f"{CARD}.count", "card"), None

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_build_node(self, node: NodeInfo, shared: dict[str, object] | None) -> Any:
        state = super().kubegpu_scheduler_build_node(node, shared)
        if state is not None:
            state.__class__ = self.kind
        return state


@pytest.mark.parametrize("kind", [ListingHolders, Failing, Exiting], ids=["unhashable", "raises", "exits"])
def test_a_scoring_content_that_is_no_key_costs_its_nodes_their_sharing_not_the_cycle(
    kind: type[WholeDeviceNodeState], caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("cards", Overriding(kind))], autoload=False))
    for i in range(3):
        engine.add_node(make_node(f"n{i}", labels={f"{CARD}.count": "4"}, allocatable={CARD: 4}))
    with caplog.at_level(logging.ERROR):
        for i in range(4):
            decision = engine.schedule(make_pod(f"p{i}", {"main": {CARD: 1}}))
            assert decision.scheduled, decision.reason
    assert "cards" in caplog.text and "scoring_content" in caplog.text
