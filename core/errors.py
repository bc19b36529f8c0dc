"""Errors that name what is wrong in one line, built from pydantic's validation errors."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["InputError", "describe_validation_error"]


class InputError(ValueError):
    """Bad input (an annotation, a manifest, a body): the message is one line naming the field."""


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """`prefix: field.path: problem` for the first error, with a count of the others."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = _location(tuple(first["loc"]))
    if prefix:
        where = f"{prefix}.{where}" if first["loc"] else prefix
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{where}: {message}{more}"
