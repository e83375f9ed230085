"""Helpers users import: ``RewardProcessors`` (also at ``comlrl.utils.reward_processor``, as in
comlrl 1.4.3), and ``set_reward_range`` / ``resolve_reward_range`` (comlrl 1.4.3's: a reward
function's declared range, which ``log_reward_distribution=True`` histograms over); and 1.4.3's
``build_formatters``, ``call_reward_function``, ``resolve_tokenizers`` and
``read_checkpoint_metadata`` (:mod:`comlrl.compat.helpers`)."""

from comlrl.compat.moved import moved_name
from comlrl.utils.reward_processor import RewardProcessors
from comlrl.utils.reward_range import resolve_reward_range, set_reward_range

_HELPERS = ("build_formatters", "call_reward_function", "read_checkpoint_metadata", "resolve_tokenizers")

__all__ = ["RewardProcessors", "resolve_reward_range", "set_reward_range", *_HELPERS]


def __getattr__(name: str):
    # comlrl.compat.helpers is imported on first use: it imports modules that import this package.
    if name in _HELPERS:
        from comlrl.compat import helpers

        return getattr(helpers, name)
    moved_name(__name__, name)  # comlrl 1.4.3's other helpers: an error naming what to use instead
