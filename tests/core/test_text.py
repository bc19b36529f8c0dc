"""`safe_text`: what any text from a tenant or a node becomes before a terminal, a log line, an Event or a pod
condition shows it: one bounded line, every character a terminal could act on written as a visible escape."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.text import MAX_TEXT_CHARS, safe_text

HOSTILE = {
    "carriage-return": ("a\rb", "a\\rb"),
    "newline": ("a\nb", "a\\nb"),
    "clear-screen": ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),
    "osc52-clipboard": ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),
    "c1-csi": ("\x9b2J", "\\x9b2J"),
    "bidi-override": ("abc\u202edcba", "abc\\u202edcba"),
    "bidi-isolate": ("\u2066x\u2069", "\\u2066x\\u2069"),
    "line-separator": ("a\u2028b", "a\\u2028b"),
    "lone-surrogate": ("a\ud800b", "a\\ud800b"),
    "nul": ("a\x00b", "a\\x00b"),
}


@pytest.mark.parametrize(("text", "shown"), HOSTILE.values(), ids=HOSTILE.keys())
def test_every_character_a_terminal_could_act_on_is_escaped_visibly(text: str, shown: str) -> None:
    assert safe_text(text) == shown
    assert safe_text(text).isprintable()


@pytest.mark.parametrize("text", ["[/]", "[blink]x[/blink]", 'node(s) have no GPU of model "A100"', "ü 设备 🚀", ""])
def test_printable_text_is_kept_as_it_is(text: str) -> None:
    assert safe_text(text) == text


def test_long_text_is_cut_to_the_limit_with_a_count_of_what_is_left() -> None:
    text = "x" * 200_000
    shown = safe_text(text)
    assert len(shown) == MAX_TEXT_CHARS
    kept = shown.index("…")
    assert shown == "x" * kept + f"… ({200_000 - kept} more characters)"


def test_escapes_count_towards_the_limit_and_are_never_cut_in_half() -> None:
    text = "\x1b" * 50_000
    shown = safe_text(text, 100)
    assert len(shown) <= 100
    head, marker = shown.split("…")
    assert head == "\\x1b" * (len(head) // 4)
    assert marker == f" ({50_000 - len(head) // 4} more characters)"


def test_a_cut_text_quoted_in_a_longer_one_and_cut_again_counts_the_original() -> None:
    reason = safe_text("m" * 200_000)  # a plugin's reason, bounded
    summary = safe_text(f'0/1 nodes are available: 1 node(s) have no GPU of model "{reason}".')
    kept = summary.index("…") - len('0/1 nodes are available: 1 node(s) have no GPU of model "')
    assert len(summary) <= MAX_TEXT_CHARS
    assert summary.endswith(f"… ({200_000 - kept + 2} more characters)")  # the closing quote and full stop too


def test_the_result_is_stable_when_shown_again() -> None:
    for text in ("a\rb" * 1000, "x" * 5000, "[blink]\x1b"):
        once = safe_text(text)
        assert safe_text(once) == once


def test_extra_characters_get_a_backslash() -> None:
    assert safe_text('say "hi" \\ \x1b', also='\\"') == 'say \\"hi\\" \\\\ \\x1b'


def cut_char_by_char(text: str, limit: int) -> str:
    """`safe_text`'s cut written out a character at a time, as it was before its fast path for printable text."""
    from kubegpu.core.text import _escape, _marker

    if len(text) <= limit and text.isprintable():
        return text
    pieces: list[str] = []
    used = consumed = 0
    for char in text[: limit + 1]:
        piece = char if char.isprintable() else _escape(char)
        if used + len(piece) > limit:
            break
        pieces.append(piece)
        used += len(piece)
        consumed += 1
    else:
        return "".join(pieces)
    marker = _marker(text, consumed)
    while pieces and used + len(marker) > limit:
        used -= len(pieces.pop())
        consumed -= 1
        marker = _marker(text, consumed)
    return "".join(pieces) + marker


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["x", "é", "设", "🚀", " ", "\n", "\x1b", "… (12 more characters)", "… (7"]), max_size=400
    ),
    st.integers(0, 300),
)
def test_a_long_printable_text_is_cut_as_character_by_character(parts: list[str], limit: int) -> None:
    # A replay refuses thousands of pods with reasons past the limit: printable ones are cut in one slice.
    text = "".join(parts)
    assert safe_text(text, limit) == cut_char_by_char(text, limit)
