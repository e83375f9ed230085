"""Which rows of a step teach nothing: DAPO's dynamic-sampling filter, for several agents and
multi-turn trees."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def flat_rows(credits: Sequence[Sequence[Tensor]], children: Sequence[Tensor]) -> Tensor:
    """The rows (first-turn nodes) whose every group has one return in all its samples: DAPO's
    filter (Yu et al., 2025, "DAPO", section 3.2, dynamic sampling) for several agents and
    multi-turn trees. A group baseline (``mean``, ``rloo``, ``max``) gives such a row zero
    advantage for every sample of every agent, so it adds no policy gradient.

    A row is flat when, at every node of its tree, every agent's G credited returns are equal
    (exactly: the filter is for rewards that take few values) in every signal. A row where one
    agent's groups are flat and another's are not is NOT flat: the other agent learns from it,
    and the flat agent's zero advantages add nothing to its own gradient.

    Args:
        credits: signals, each one ``(N, M_t, G)`` tensor per turn: the return credited to
            each agent's samples at each node (the summed reward's; with per-function
            normalisation also each function's).
        children: one ``(M_t, J)`` long tensor per turn, the node at turn t+1 each joint
            action started, -1 for none.

    Returns:
        ``(M_1,)`` bool, True for a flat row.
    """
    flat_below: Tensor | None = None  # (M_{t+1},) every node of the subtree below is flat
    for t in reversed(range(len(children))):
        flat = torch.stack([(c[t].amax(dim=-1) == c[t].amin(dim=-1)).all(dim=0) for c in credits]).all(dim=0)
        child = children[t]
        if flat_below is not None and (child >= 0).any():
            below = torch.where(child >= 0, flat_below[child.clamp(min=0)], True)  # (M_t, J)
            flat = flat & below.all(dim=1)
        flat_below = flat
    return flat_below
