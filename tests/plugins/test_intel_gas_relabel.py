"""An Intel GPU node whose cards change while pods hold shares of them: a card the Intel labeler stops listing
(`gpu.intel.com/gpu-numbers` loses it, the device plugin's totals shrink), or one kubegpu's advertiser marks
unhealthy (its sysfs directory gone). The pod on that card kept the whole node: re-taken after the change, its
allocation was refused (`card0 is not an Intel GPU card of this node`, `card0 is unhealthy`), and, as a pod that "no
longer fits its devices", it left every card of the node to no other pod until it ended, although the other cards
were whole and GAS went on placing on them. A pod keeps what it holds on an unhealthy card, holds nothing on a card
the node no longer has, and the node's other cards take new pods; no card is given twice."""

from __future__ import annotations

import pytest

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices, NodeInfo
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.intel_gas import scheduler as gas
from kubegpu.scheduler.engine import Engine

I915, MEM = "gpu.intel.com/i915", "gpu.intel.com/memory.max"


def labelled(*numbers: int) -> NodeInfo:
    """The node as the Intel labeler and device plugin show it: 4 containers and 8G a card."""
    labels = {"gpu.intel.com/gpu-numbers": ".".join(map(str, numbers))}
    return make_node("max-0", labels=labels, allocatable={I915: 4 * len(numbers), MEM: f"{8 * len(numbers)}G"})


def advertised(card0_healthy: bool) -> NodeInfo:
    """The node as kubegpu's advertiser shows it: card0 stays listed, unhealthy, once its sysfs directory is gone."""
    inventory = DeviceInventory(
        plugin="intel-gas", devices=[DeviceInfo(id="card0", healthy=card0_healthy), DeviceInfo(id="card1")]
    )
    serving = 1 + card0_healthy
    return make_node(
        "max-0",
        allocatable={I915: 4 * serving, MEM: f"{8 * serving}G"},
        annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"intel-gas": inventory}))},
    )


def place(engine: Engine, name: str, memory: str, **annotations: str) -> str | None:
    decision = engine.schedule(make_pod(name, {"main": {I915: 1, MEM: memory}}, annotations=annotations))
    assert decision.scheduled or decision.reason, decision
    return decision.annotations.get("gas-container-cards") if decision.scheduled else decision.reason


@pytest.mark.parametrize(
    ("before", "after"),
    [(labelled(0, 1), labelled(1)), (advertised(True), advertised(False))],
    ids=["card0-no-longer-labelled", "card0-advertised-unhealthy"],
)
def test_a_card_lost_under_a_pod_leaves_the_other_cards_to_new_pods(before: NodeInfo, after: NodeInfo) -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("intel-gas", gas)], autoload=False))
    engine.add_node(before)
    assert place(engine, "on-card0", "2G", **{"gas-allow": "card0"}) == "card0"
    assert place(engine, "on-card1", "2G", **{"gas-allow": "card1"}) == "card1"

    engine.add_node(after)

    assert engine.nodes["max-0"].unheld == {}
    refused = place(engine, "lost", "1G", **{"gas-allow": "card0"})
    assert refused is not None and "gas-allow/gas-deny annotations exclude every Intel GPU card" in refused, refused
    # card1's 8G: 2G held; the node's 8G in total: 4G requested by the two pods, as kube-scheduler counts them.
    assert place(engine, "new", "4G") == "card1"
    state = engine.nodes["max-0"].states["intel-gas"]
    assert state.usage[MEM][state.cards.index("card1")] == 6 * 10**9  # on-card1's and new's, each once


def test_the_pod_on_an_unhealthy_card_still_holds_it_when_the_card_recovers() -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("intel-gas", gas)], autoload=False))
    engine.add_node(advertised(True))
    assert place(engine, "on-card0", "6G", **{"gas-allow": "card0"}) == "card0"
    engine.add_node(advertised(False))
    assert place(engine, "meanwhile", "2G") == "card1"
    engine.add_node(advertised(True))
    refused = place(engine, "after", "3G", **{"gas-allow": "card0"})
    assert refused is not None and "the most free on any card is 2G" in refused, refused
