"""The multi-agent DPO objective on sequence log-probabilities: pure tensor functions.

DPO (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290) fits a policy to preferences
"chosen beats rejected" with ``-log sigmoid(beta * margin)``, the margin being how much more
the policy (relative to a reference, or not: reference-free) favours the chosen answer. K
agents that act independently form a joint policy whose log-probability is the sum of
theirs, so a joint action's margin is the sum of the agents' margins:

    Δ_a = log π_a(y_a^w | x_a) - log π_a(y_a^l | x_a)  [- the same under agent a's reference]
    Δ   = Σ_a Δ_a
    L   = mean over pairs of -log σ(β Δ)

Agent a minimises ``-log σ(β (Δ_a + sg(Σ_{b≠a} Δ_b)))`` (sg: no gradient), whose gradient
with respect to agent a's weights is exactly the joint loss's: agents can backpropagate one
at a time, each holding only its own graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


def preference_deltas(chosen_logps: Tensor, rejected_logps: Tensor, reference_deltas: Tensor | None = None) -> Tensor:
    """``(P,)`` margin Δ of one agent on P pairs.

    Args:
        chosen_logps: ``(P,)`` log π(y^w | x), each summed over the completion's tokens.
        rejected_logps: ``(P,)`` log π(y^l | x), likewise.
        reference_deltas: ``(P,)`` the reference policy's ``chosen - rejected``; None: reference-free.
    """
    deltas = chosen_logps - rejected_logps
    return deltas if reference_deltas is None else deltas - reference_deltas


def others_deltas(deltas: Tensor) -> Tensor:
    """``(K, P) -> (K, P)``: entry ``[a, p]`` is ``Σ_{b≠a} deltas[b, p]``, the other agents' margin."""
    return deltas.sum(dim=0, keepdim=True) - deltas


def agent_dpo_losses(own_deltas: Tensor, other_deltas: Tensor, beta: float) -> Tensor:
    """``(P,)`` one agent's DPO loss per pair, ``-log σ(β (Δ_a + sg(Σ_{b≠a} Δ_b)))``.

    Args:
        own_deltas: ``(P,)`` Δ_a, with the gradient to agent a's weights.
        other_deltas: ``(P,)`` the other agents' summed margin (:func:`others_deltas`);
            detached here, so agent a's gradient is the joint loss's.
        beta: DPO's beta (> 0).
    """
    return -F.logsigmoid(beta * (own_deltas + other_deltas.detach()))


class JointPreference(NamedTuple):
    """How the joint policy scores P pairs."""

    loss: Tensor
    """``(P,)`` the joint DPO loss ``-log σ(β Δ)`` of each pair."""
    margin: Tensor
    """``(P,)`` the joint margin Δ = Σ_a Δ_a."""
    correct: Tensor
    """``(P,)`` bool: Δ > 0, the joint policy favours the chosen joint action."""


def joint_preference(deltas: Tensor, beta: float) -> JointPreference:
    """The joint loss, margin and ranking of P pairs from ``(K, P)`` per-agent margins."""
    margin = deltas.sum(dim=0)
    return JointPreference(-F.logsigmoid(beta * margin), margin, margin > 0)
