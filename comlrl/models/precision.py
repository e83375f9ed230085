"""``precision="bf16"``: the agents (and separate critics) hold bf16 parameters, which both
sample and learn, while the optimizer steps fp32 master copies of them
(:class:`~comlrl.engine.master_weights.MasterWeights`).

Why not fp32 weights under autocast: autocast casts every fp32 weight to bf16 at every
operator, each forward and each decoding step, which on a CPU with bf16 matrix units costs
about as much as the bf16 products save; and sampling then needs a bf16 copy of each agent
beside the fp32 one. With bf16 parameters the sampler is the learner itself, no copy.
Buffers keep their dtype: rotary frequencies in bf16 would shift positions.
"""

from __future__ import annotations

import torch


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` with its floating-point parameters in ``dtype``, in place (the same
    ``Parameter`` objects); buffers keep theirs."""
    for parameter in model.parameters():
        if parameter.is_floating_point() and parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    return model
