"""Train and eval mode, in one place.

Sampling, the sampling-time and reference log-probs and the critics' rollout values run in
eval mode without gradient (:func:`frozen`); the update's forwards run in train mode, because
activation checkpointing in transformers only runs in train mode. What else differs between
the two modes in a language model is dropout, so the trainers turn it off once, at
construction (:func:`disable_dropout`, as TRL's ``disable_dropout``): then every forward of a
step computes the same function, the first pass's ratio is exactly 1 and the KL to an
unchanged reference exactly 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout of ``model`` to 0 in place and return how many were on.

    Dropout lives in ``nn.Dropout`` modules (GPT-2, LoRA's ``lora_dropout``, value heads) and
    in float attributes that attention layers pass to their kernel in train mode (Llama's and
    Qwen's ``attention_dropout``); both are zeroed. The model's config is left as it was, so a
    saved model keeps its own dropout settings for whoever fine-tunes it next.
    """
    zeroed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            zeroed += module.p > 0
            module.p = 0.0
            continue
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float) and not isinstance(value, bool):
                zeroed += value > 0
                setattr(module, name, 0.0)
    return zeroed


@contextlib.contextmanager
def frozen(model: torch.nn.Module, inference: bool = False) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode without gradient (``inference_mode`` with ``inference=True``);
    its mode is restored on the way out, an exception included."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode() if inference else torch.no_grad():
            yield model
    finally:
        model.train(was_training)
