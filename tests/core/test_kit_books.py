"""The plugin kit's books, as a plugin that writes its own hooks uses them (the nvidia plugin does): whole devices
held and given back, and devices shared by amounts of several dimensions, never over a device's capacity, never
beside a whole holder, at most `split` shares per device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.kit import SharedDeviceNodeState, WholeDeviceNodeState
from kubegpu.core.models import DeviceInfo, PluginAllocation


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
