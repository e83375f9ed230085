"""Pure tensor functions of the trainers' objectives (MAGRPO's and its family's, the critics',
MADPO's, the reward model's): no models, no trainers, no config objects."""

from comlrl.algorithms.advantages import BASELINES, batch_scaled, decoupled_advantages, group_advantages
from comlrl.algorithms.dpo import JointPreference, agent_dpo_losses, joint_preference, others_deltas, preference_deltas
from comlrl.algorithms.filtering import flat_rows
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
from comlrl.algorithms.masks import completion_mask, top_entropy_mask
from comlrl.algorithms.policy_terms import PolicyTerms, micro_batch_policy_terms
from comlrl.algorithms.reward_model import bradley_terry_loss, pair_accuracy
from comlrl.algorithms.sampler_correction import (
    SAMPLER_CORRECTIONS,
    SamplerCorrection,
    sampler_importance_weights,
    sampler_logprob_gap,
)
from comlrl.algorithms.surrogates import (
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
    PolicyObjective,
    Surrogate,
    policy_surrogate,
)

__all__ = [
    "BASELINES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "JOINT_MODES",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "SAMPLER_CORRECTIONS",
    "TURN_WEIGHTINGS",
    "JointPreference",
    "PolicyLoss",
    "PolicyObjective",
    "PolicyTerms",
    "SamplerCorrection",
    "Surrogate",
    "agent_dpo_losses",
    "batch_scaled",
    "bradley_terry_loss",
    "completion_mask",
    "decoupled_advantages",
    "flat_rows",
    "group_advantages",
    "joint_action_indices",
    "joint_preference",
    "k3_kl",
    "micro_batch_policy_terms",
    "others_deltas",
    "pair_accuracy",
    "per_agent_returns",
    "policy_gradient_loss",
    "policy_surrogate",
    "preference_deltas",
    "sampler_importance_weights",
    "sampler_logprob_gap",
    "selective_log_softmax",
    "token_weights",
    "top_entropy_mask",
    "turn_token_weights",
]
