"""What comlrl adds to a vLLM worker (``LLM(worker_extension_cls=...)``).

Each engine of the ``vllm`` backend runs in a process of its own (vLLM's engine process), so
the trainer reaches its model only through ``LLM.collective_rpc`` by method name. vLLM mixes
this class into its GPU worker there: ``self`` is the worker, ``self.model_runner`` its model
runner. Arguments travel through vLLM's message encoding: paths and numbers, never tensors
(its shared-memory broadcast cannot pickle them).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from safetensors.torch import load_file


class WorkerExtension:
    def comlrl_reload_weights(self, path: str) -> None:
        """Reload the engine's model, in place, from the Hugging Face-named weights of the
        safetensors file at ``path`` (every parameter of the model), through the model runner's
        ``reload_weights``, which maps the names onto vLLM's fused layout and redoes what
        loading does after the weights (the CPU build repacks its linear layers there; the
        model's own ``load_weights`` would write into the repacked, empty parameters)."""
        weights = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))

    def comlrl_seed(self, seed: int) -> None:
        """Seed every generator the sampler may draw from for the next call: torch's (the
        sampler's exponential draws) and numpy's (where the model runner picks a seed for each
        request that brings none)."""
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
