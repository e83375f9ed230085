"""Values quoted in messages."""

import math


def short_repr(value: object, limit: int = 200) -> str:
    """``repr(value)`` in at most ``limit`` characters (cut with "..."), so a message or a
    record quoting a long value stays readable; a ``__repr__`` that raises is described
    instead, so quoting a value never fails."""
    try:
        text = repr(value)
    except Exception as error:
        text = f"<repr failed: {type(error).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def number_string_error(name: str, value: str, integer: bool = False, or_none: bool = False) -> ValueError:
    """The error for ``value``, a string, given where a number goes (``name``, an integer one
    when ``integer``, or None when ``or_none``): a command line or a YAML file hands numbers
    over as strings, and comparing one with a bound would fail with a ``TypeError`` naming
    nothing. When the string spells a number, the error says how to write it."""
    kind, convert = ("an integer", int) if integer else ("a number", float)
    message = f"{name} must be {kind}{' or None' if or_none else ''}, got the string {value!r} (str)"
    try:
        number = convert(value)
    except ValueError:
        return ValueError(message)
    if not math.isfinite(number):
        return ValueError(message)
    return ValueError(
        f"{message}: write {number!r} ({convert.__name__}(...) when it comes from a command line or a file)"
    )
