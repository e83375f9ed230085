"""comlrl: cooperative multi-LLM reinforcement learning.

from comlrl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors
"""

from comlrl.compat import paths as _compat_paths
from comlrl.compat import rewards as _compat_rewards  # noqa: F401  (installs 1.4.3's reward calls)
from comlrl.trainers import *  # noqa: F403
from comlrl.trainers import __all__ as _trainers
from comlrl.utils.reward_processor import RewardProcessors

__version__ = "0.1.0"

_compat_paths.install()

__all__ = [*_trainers, "RewardProcessors"]
