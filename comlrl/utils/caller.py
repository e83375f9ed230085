"""Warnings that point at the user's line, not at ours."""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this package (and
    outside the code dataclasses generate), whatever the depth of the calls inside it."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code.co_filename.startswith(_PACKAGE) or frame.f_code.co_filename == "<string>"
    ):
        frame, level = frame.f_back, level + 1
    return level


_WARNED: set[tuple[str, ...]] = set()


def warn_once(key: tuple[str, ...], message: str, category: type[Warning]) -> None:
    """``message`` the first time this process meets ``key`` (a config class and field), pointed at the user's line."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, category, stacklevel=user_stacklevel())
