"""Text someone else wrote, made safe to show: on a terminal, in a log line, in an Event or a pod condition.

Tenants write pod names, annotations and Events; nodes write their inventories (device ids); a simulator file holds
whatever its author put there. kubegpu repeats such text: a plugin quotes the GPU model a pod asked for in its
refusal, `kubegpu top` draws device ids and prints the reasons pods wait, the scheduler logs and reports them. Shown
raw, a carriage return forges a log line, an escape sequence clears the operator's screen or writes to their
clipboard (OSC 52), a bidi override reverses what they read, and 200 KB fill a log line per scheduling attempt.

`safe_text` is the one answer, used wherever such text leaves kubegpu: one line of printable characters, each
character that is not printable (C0 and C1 controls, CR and ESC among them, DEL, bidi overrides and isolates, line
and paragraph separators, lone surrogates, unassigned code points) written as a visible Python escape (`\\x1b`,
`\\r`, `\\u202e`), and at most `MAX_TEXT_CHARS` characters, the cut marked with how much was left out. It does not
touch rich's markup (`[blink]`): a terminal front-end hands the result to rich as a `rich.text.Text`, never as
markup. Text that is already safe, the usual case, is returned as it is after two C-speed checks.
"""

from __future__ import annotations

import re

__all__ = ["MAX_TEXT_CHARS", "escape_controls", "safe_text"]

MAX_TEXT_CHARS = 1024  # one bound for any text from outside, a refusal reason above all, wherever it is shown

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_MARKER = re.compile(r"… \((\d{1,18}) more characters\)")


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """`text` with every character that is not printable written as its escape, nothing cut (see `safe_text`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def safe_text(text: str, limit: int = MAX_TEXT_CHARS, *, also: str = "") -> str:
    """`text` as one line of at most `limit` printable characters.

    Every character that is not printable becomes its escape (`\\x1b`); a character of `also` gets a backslash
    (logfmt passes `\\"` so that its quoted values stay unambiguous). Past `limit` the text is cut, never inside
    an escape, and ends with `… (N more characters)`, N counting the characters of `text` left out; the whole
    result, marker included, fits in `limit`.
    """
    plain = text.isprintable() and not (also and any(c in text for c in also))
    if plain and len(text) <= limit:
        return text
    if plain and _MARKER.search(text) is None:
        # Each character its own piece and no earlier cut to count: the loop below would keep `limit` characters,
        # then give them back one by one until the marker fits.
        kept = limit
        while kept and kept + len(f"… ({len(text) - kept} more characters)") > limit:
            kept -= 1
        return text[:kept] + f"… ({len(text) - kept} more characters)"
    pieces: list[str] = []
    used = 0
    consumed = 0
    for char in text[: limit + 1]:  # every piece is at least one character: the loop ends by this bound
        piece = "\\" + char if char in also else char if char.isprintable() else _escape(char)
        if used + len(piece) > limit:
            break
        pieces.append(piece)
        used += len(piece)
        consumed += 1
    else:  # nothing had to be cut: `text` was at most `limit` characters
        return "".join(pieces)
    marker = _marker(text, consumed)
    while pieces and used + len(marker) > limit:
        used -= len(pieces.pop())
        consumed -= 1
        marker = _marker(text, consumed)
    return "".join(pieces) + marker


def _marker(text: str, consumed: int) -> str:
    """`… (N more characters)` for `text` cut after `consumed` characters. A marker of an earlier cut among the
    characters left out (a reason bounded, then quoted in a longer one) counts what it stood for, so the count is
    of the original text."""
    left = len(text) - consumed
    earlier = _MARKER.search(text, consumed)
    if earlier is not None:
        left += int(earlier.group(1)) - len(earlier.group(0))
    return f"… ({left} more characters)"
