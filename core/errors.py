"""Errors that name what is wrong in one line, built from pydantic's validation errors.

Every decoder of outside input (annotations, manifests, quantities, simulator files, HTTP bodies) raises a subclass
of `InputError`, so a caller at a loop boundary catches one type. The message is one bounded line whatever the input
held: field names and values quoted in it are shortened and their control characters escaped, so a hostile key of a
megabyte or one holding a newline cannot flood or forge a log line.
"""

from __future__ import annotations

from pydantic import ValidationError

from kubegpu.core.text import escape_controls

__all__ = ["InputError", "describe_validation_error", "shorten"]

MAX_NAME_CHARS = 80  # one field name (a dict key from the input) inside a message
MAX_MESSAGE_CHARS = 300  # the problem part of a message


class InputError(ValueError):
    """Bad input (an annotation, a manifest, a body): the message is one line naming the field."""


def shorten(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """`text` on one line and at most `limit` characters: control characters escaped, the middle elided."""
    if not text.isprintable():
        text = escape_controls(text[: 4 * limit])
    if len(text) > limit:
        tail = (limit - 1) // 3
        text = text[: limit - 1 - tail] + "…" + (text[-tail:] if tail else "")
    return text


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = shorten(str(part))
            text += f".{name}" if text else name
    return text or "(top level)"


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """`prefix: field.path: problem` for the first error, with a count of the others."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    where = _location(tuple(first["loc"]))
    if prefix:
        where = f"{prefix}.{where}" if first["loc"] else prefix
    message = shorten(first["msg"].removeprefix("Value error, "), MAX_MESSAGE_CHARS)
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{where}: {message}{more}"
