"""`safe_text`: what any text from a tenant or a node becomes before a terminal, a log line, an Event or a pod
condition shows it: one bounded line, every character a terminal could act on written as a visible escape."""

from __future__ import annotations

import pytest

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
