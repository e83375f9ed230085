"""Values quoted in messages."""


def short_repr(value: object, limit: int = 200) -> str:
    """``repr(value)`` in at most ``limit`` characters (cut with "..."), so a message or a
    record quoting a long value stays readable; a ``__repr__`` that raises is described
    instead, so quoting a value never fails."""
    try:
        text = repr(value)
    except Exception as error:
        text = f"<repr failed: {type(error).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
