"""Helpers users import: ``RewardProcessors`` (also at ``comlrl.utils.reward_processor``, as in
comlrl 1.4.3), and ``set_reward_range`` / ``resolve_reward_range`` (comlrl 1.4.3's: a reward
function's declared range, which ``log_reward_distribution=True`` histograms over)."""

from comlrl.compat.moved import moved_name
from comlrl.utils.reward_processor import RewardProcessors
from comlrl.utils.reward_range import resolve_reward_range, set_reward_range

__all__ = ["RewardProcessors", "resolve_reward_range", "set_reward_range"]


def __getattr__(name: str):  # comlrl 1.4.3's helpers: an error naming what to use instead
    moved_name(__name__, name)
