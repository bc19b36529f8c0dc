"""The plugin kit's books, as the built-in plugins use them: whole devices held and given back, devices shared by
amounts of several dimensions (nvidia, intel-gas), never over a device's capacity, never beside a whole holder, at
most `split` shares per device, and devices made of parts held one by one (neuron's cores). The built-ins are kit
plugins registered through their entry points as instances, as a pip-installed plugin is."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from importlib_metadata import entry_points

from kubegpu.core import scheduler_hooks
from kubegpu.core.kit import (
    Claim,
    DevicePlugin,
    PartedDeviceNodeState,
    SharedDeviceNodeState,
    WholeDeviceNodeState,
)
from kubegpu.core.models import DeviceInfo, Occupancy, PluginAllocation
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.plugins.nvidia import scheduler as nvidia_scheduler


def cards(split: int = 2) -> SharedDeviceNodeState:
    """Three accelerator cards: compute in percent, memory in MiB (card 2's memory unknown, so in percent)."""
    state = SharedDeviceNodeState(
        "acme",
        "node-a",
        ["card0", "card1", "card2"],
        [True, True, True],
        (("compute", [100, 100, 100], ["%", "%", "%"]), ("memory", [8192, 8192, 100], ["MiB", "MiB", "%"])),
        split,
    )
    state.noun = "card"
    return state


def test_whole_devices_are_held_once_and_given_back_idempotently() -> None:
    state = WholeDeviceNodeState("acme", "node-a", [DeviceInfo(id="a0"), DeviceInfo(id="a1", healthy=False)])
    allocation = PluginAllocation(plugin="acme", containers={"main": {"acme.com/card": ["a0", "a1"]}})
    bits, error = state.read_whole(allocation, {"acme.com/card"})
    assert (bits, error) == ([0, 1], None)
    assert state.cannot_hold(bits) is None
    state.hold(bits, "ns/first")  # a pod may keep an unhealthy device it already held
    assert state.free == 0 and state.cannot_hold([0]) == "device a0 is already held by ns/first"
    state.unhold(bits, "ns/other")  # not its devices: nothing changes
    assert state.holders == ["ns/first", "ns/first"]
    state.unhold(bits, "ns/first")
    state.unhold(bits, "ns/first")
    assert state.free == 0b01  # the unhealthy device is never free again
    foreign = PluginAllocation(plugin="acme", containers={"main": {"other.com/x": ["a0"]}})
    assert state.read_whole(foreign, {"acme.com/card"})[1] == (
        "container main: resource other.com/x is not scheduled by plugin acme"
    )


@pytest.mark.parametrize(
    ("shares", "reason"),
    [
        ([(0, (60, 1024)), (0, (50, 1024))], "card card0 has 100% compute free, the allocation takes 110%"),
        ([(1, (10, 9000))], "card card1 has 8192 MiB memory free, the allocation takes 9000 MiB"),
        ([(2, (10, 101))], "card card2 has 100% memory free, the allocation takes 101%"),
        ([(0, (1, 1)), (0, (1, 1)), (0, (1, 1))], "card card0 already runs 0 of at most 2 shares"),
    ],
    ids=["compute", "memory-mib", "memory-percent", "split"],
)
def test_a_share_over_a_cards_books_is_refused_naming_what_is_short(
    shares: list[tuple[int, tuple[int, int]]], reason: str
) -> None:
    state = cards()
    assert state.cannot_share(shares) == reason
    assert state.used == ([0, 0, 0], [0, 0, 0]) and state.tasks == [0, 0, 0]


def test_shares_and_whole_holders_never_meet() -> None:
    state = cards()
    state.hold([1], "ns/whole")
    assert state.cannot_share([(1, (10, 10))]) == "card card1 is held whole by ns/whole; a share never lands on it"
    state.share("ns/a", [(0, (30, 1024))])
    assert state.cannot_hold([0]) == "card card0 is shared (1 share(s)); a whole-card pod never shares"
    assert state.free == 0b100 and not state.shareable(1) and state.shareable(0)
    state.unshare("ns/a")
    state.unshare("ns/a")  # once
    assert state.free == 0b101 and state.used == ([0, 0, 0], [0, 0, 0]) and state.shared == {}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 100), st.integers(0, 9000), st.integers(0, 5)),
        max_size=30,
    )
)
def test_books_never_go_over_capacity_and_free_means_untouched(
    steps: list[tuple[bool, int, int, int, int]],
) -> None:
    state = cards(split=3)
    live: list[str] = []
    for n, (add, card, compute, memory, pick) in enumerate(steps):
        if add or not live:
            share = [(card, (compute, memory))]
            if state.cannot_share(share) is None:
                state.share(f"p{n}", share)
                live.append(f"p{n}")
        else:
            state.unshare(live.pop(pick % len(live)))
        for i in range(3):
            assert 0 <= state.used[0][i] <= 100 and 0 <= state.used[1][i] <= state.capacity[1][i]
            assert 0 <= state.tasks[i] <= 3
            assert bool(state.free >> i & 1) == (state.tasks[i] == 0 and state.holders[i] is None)


BUILT_INS = ("nvidia", "neuron", "intel-gas")


@pytest.mark.parametrize("name", BUILT_INS)
def test_a_built_in_plugin_is_a_kit_plugin_registered_as_an_instance(name: str) -> None:
    # The entry point names an instance of a kit class, and the plugin's module has no hook functions of its own:
    # take, release, headroom and describe are the kit's, as for a third party's plugin.
    (point,) = [p for p in entry_points(group="kubegpu.scheduler") if p.name == name]
    plugin = point.load()
    assert isinstance(plugin, DevicePlugin), f"{point.value} is a {type(plugin).__name__}, not a kit plugin"
    assert plugin.name == name
    module = __import__(point.module, fromlist=["_"])
    marker = f"{scheduler_hooks.PROJECT}_impl"
    assert not [n for n, v in vars(module).items() if callable(v) and hasattr(v, marker)]
    for hook in ("take", "release", "headroom", "describe"):
        method = getattr(type(plugin), f"kubegpu_scheduler_{hook}")
        assert method is getattr(DevicePlugin, f"kubegpu_scheduler_{hook}"), f"{name} re-implements {hook}"


def cores(parts: int = 2) -> PartedDeviceNodeState:
    """Devices 0, 1 and 3 (2 missing, 3 unhealthy), each of `parts` cores."""
    state = PartedDeviceNodeState("acme", "node-a", ["0", "1", "2", "3"], [True, True, False, False], parts, 0b1011)
    state.part_noun = "core"
    return state


def test_parts_and_whole_devices_never_meet_and_come_back_exactly() -> None:
    state = cores()
    assert (state.free, state.free_parts) == (0b0011, 0b1111)
    assert (
        state.cannot_take(Claim(parts=[0], whole=[0])) == "core 0 is on device 0, which the same allocation takes whole"
    )
    assert state.cannot_take(Claim(whole=[2])) == "device 2 does not exist on this node"
    assert state.cannot_take(Claim(parts=[5])) == "core 5 does not exist on this node"
    state.take("ns/a", Claim(parts=[1]))
    assert (state.free, state.free_parts) == (0b0010, 0b1101)
    assert state.cannot_take(Claim(whole=[0])) == "device 0 is already held by ns/a"
    assert state.cannot_take(Claim(parts=[1])) == "core 1 is already held by ns/a"
    state.take("ns/b", Claim(whole=[1, 3]))  # a pod may keep an unhealthy device it already held
    assert state.cannot_take(Claim(parts=[2])) == "core 2 is already held by ns/b"
    assert (state.free, state.free_parts, state.utilization()) == (0, 0b0001, 0.75)
    cells = state.cells()
    assert [(c.id, c.holders, c.used, c.healthy) for c in cells] == [
        ("0", ["ns/a"], 0.5, True),
        ("1", ["ns/b"], 1.0, True),
        ("3", ["ns/b"], 1.0, False),
    ]
    state.give_back("ns/a", Claim(parts=[1], whole=[1]))  # not ns/a's device: left alone
    state.give_back("ns/a", Claim(parts=[1]))
    assert (state.free, state.free_parts) == (0b0001, 0b0011)
    state.give_back("ns/b", Claim(whole=[1, 3]))
    assert (state.free, state.free_parts, state.part_holders, state.parts_held_on) == (0b0011, 0b1111, {}, {})


def test_giving_back_devices_or_parts_the_node_does_not_have_leaves_the_books_alone() -> None:
    """A release names what the pod holds; one naming devices past the node's last (a stale or hand-written
    allocation) or below 0 gives back nothing, raises nothing, and never frees the device a negative index would wrap
    to."""
    state = cores()
    state.take("ns/a", Claim(whole=[3]))
    state.take("ns/b", Claim(parts=[0]))
    before = (state.free, state.free_parts, list(state.holders), dict(state.part_holders))
    state.give_back("ns/a", Claim(whole=[99, -1], parts=[99, -1]))
    state.give_back("ns/b", Claim(whole=[-4], parts=[-8, 40]))
    assert (state.free, state.free_parts, list(state.holders), dict(state.part_holders)) == before
    whole = cards()
    whole.take("ns/a", Claim(whole=[2]))
    whole.give_back("ns/a", Claim(whole=[-1, 7]))  # -1 would wrap to card 2
    assert whole.holders[2] == "ns/a"
    # Taking them is refused naming them (before: card -1 taken as card 2, card 7 an IndexError, a negative shift).
    assert whole.cannot_take(Claim(whole=[-1])) == "card -1 does not exist on this node"
    assert whole.cannot_take(Claim(shares=[(7, (10, 10))])) == "card 7 does not exist on this node"
    assert state.cannot_take(Claim(whole=[-1])) == "device -1 does not exist on this node"
    assert state.cannot_take(Claim(parts=[-2])) == "core -2 does not exist on this node"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 7), st.integers(0, 5)), max_size=30))
def test_parted_books_keep_free_devices_and_parts_consistent(steps: list[tuple[bool, bool, int, int]]) -> None:
    state = cores(parts=2)
    live: list[tuple[str, Claim]] = []
    for n, (add, whole, at, pick) in enumerate(steps):
        if add or not live:
            claim = Claim(whole=[at // 2]) if whole else Claim(parts=[at])
            if state.cannot_take(claim) is None:
                state.take(f"p{n}", claim)
                live.append((f"p{n}", claim))
        else:
            key, claim = live.pop(pick % len(live))
            state.give_back(key, claim)
            state.give_back(key, claim)  # idempotent
        for d in (0, 1, 3):
            held = [p for p in (2 * d, 2 * d + 1) if p in state.part_holders]
            healthy = bool(state.healthy >> d & 1)
            assert bool(state.free >> d & 1) == (healthy and state.holders[d] is None and not held)
            for p in (2 * d, 2 * d + 1):
                free = healthy and state.holders[d] is None and p not in state.part_holders
                assert bool(state.free_parts >> p & 1) == free
    for key, claim in live:
        state.give_back(key, claim)
    assert (state.free, state.free_parts, state.holders) == (0b0011, 0b1111, [None] * 4)


class Pool(DevicePlugin[SharedDeviceNodeState]):
    """A plugin that writes no books of its own: shares read from an allocation, a second picture beside its cards."""

    resources = ("acme.com/card",)

    def claimed(self, state: SharedDeviceNodeState, allocation: PluginAllocation) -> Claim | str:
        shares = [
            (state.index[card], (compute, 0))
            for container in allocation.shares.values()
            for card, compute in container.get("acme.com/compute", {}).items()
        ]
        whole, error = state.read_whole(allocation.model_copy(update={"shares": {}, "containers": {}}), self.resources)
        return error or Claim(whole, shares)

    def more_occupancy(self, state: SharedDeviceNodeState) -> list[Occupancy]:
        return [Occupancy(family="acme-links", cells=[], total=0, free=0, largest_fit=0)]


def test_the_kits_hooks_keep_a_shared_plugins_books() -> None:
    plugin, state = Pool(), cards()
    plugin.bind_plugin_name("acme")
    shares = {"main": {"acme.com/compute": {"card0": 60}}}
    allocation = PluginAllocation(plugin="acme", containers={"main": {"acme.com/card": ["card0"]}}, shares=shares)
    assert plugin.kubegpu_scheduler_take(state, "ns/a", allocation, None).ok
    over = plugin.kubegpu_scheduler_take(state, "ns/b", allocation, None)
    assert over.message == "card card0 has 40% compute free, the allocation takes 60%"
    described = plugin.kubegpu_scheduler_describe(state)
    assert [o.family for o in described] == ["acme.com/card", "acme-links"]
    assert [(c.holders, c.used) for c in described[0].cells] == [(["ns/a"], 0.6), ([], 0.0), ([], 0.0)]
    headroom = plugin.kubegpu_scheduler_headroom(state)
    assert headroom.free == {"acme.com/card": 2} and headroom.utilization == pytest.approx(0.2)
    assert plugin.kubegpu_scheduler_release(state, "ns/a", allocation).ok
    assert plugin.kubegpu_scheduler_release(state, "ns/a", allocation).ok  # idempotent
    assert (state.free, state.used, state.version) == (0b111, ([0, 0, 0], [0, 0, 0]), 3)


def test_a_built_in_plugin_refuses_a_name_its_node_side_does_not_use(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
) -> None:
    # One object serves every plugin manager: registered as "gpu", the nvidia plugin would answer under two names.
    pm = make_plugin_manager("scheduler", gpu=nvidia_scheduler)
    assert "gpu" not in pm.records
    assert [str(f) for f in pm.failures] == [
        "plugin 'gpu' (scheduler) failed at register: bind_plugin_name failed: ValueError: "
        "plugin 'nvidia' must be registered as 'nvidia', not 'gpu'"
    ]
    assert nvidia_scheduler.plugin.name == "nvidia"
