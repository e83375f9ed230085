"""Pure tensor functions of the MAGRPO objective: no models, no trainers, no config objects."""

from comlrl.algorithms.advantages import BASELINES, group_advantages
from comlrl.algorithms.joint import JOINT_MODES, joint_action_indices, per_agent_returns
from comlrl.algorithms.logprobs import selective_log_softmax
from comlrl.algorithms.losses import (
    LOSS_AGGREGATIONS,
    TURN_WEIGHTINGS,
    PolicyLoss,
    k3_kl,
    policy_gradient_loss,
    token_weights,
    turn_token_weights,
)
from comlrl.algorithms.masks import completion_mask

__all__ = [
    "BASELINES",
    "JOINT_MODES",
    "LOSS_AGGREGATIONS",
    "TURN_WEIGHTINGS",
    "PolicyLoss",
    "completion_mask",
    "group_advantages",
    "joint_action_indices",
    "k3_kl",
    "per_agent_returns",
    "policy_gradient_loss",
    "selective_log_softmax",
    "token_weights",
    "turn_token_weights",
]
