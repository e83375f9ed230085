"""Helpers users import: ``RewardProcessors`` (also at ``comlrl.utils.reward_processor``, as in comlrl 1.4.3)."""

from comlrl.utils.reward_processor import RewardProcessors

__all__ = ["RewardProcessors"]
