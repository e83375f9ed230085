"""comlrl: cooperative multi-LLM reinforcement learning.

from comlrl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors
"""

from comlrl import _moved
from comlrl.trainers import *  # noqa: F403
from comlrl.trainers import __all__ as _trainers
from comlrl.utils.reward_processor import RewardProcessors

__version__ = "0.1.0"

_moved.install()

__all__ = [*_trainers, "RewardProcessors"]
