"""What comlrl adds to a vLLM worker (``LLM(worker_extension_cls=...)``).

Each engine of the ``vllm`` backend runs in a process of its own (vLLM's engine process), so
the trainer reaches its model only through ``LLM.collective_rpc`` by method name. vLLM mixes
this class into its GPU worker there: ``self`` is the worker, ``self.model_runner`` its model
runner. Arguments travel through vLLM's message encoding, which carries CPU tensors.
"""

from __future__ import annotations

import random

import numpy as np
import torch


class WorkerExtension:
    def comlrl_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named weights into the engine's model, in place (so CUDA graphs
        captured over the old values see the new ones); vLLM's ``load_weights`` maps the names
        onto its fused layout."""
        self.model_runner.get_model().load_weights(weights=weights)

    def comlrl_seed(self, seed: int) -> None:
        """Seed every generator the sampler may draw from for the next call: torch's (the
        sampler's exponential draws) and numpy's (where the model runner picks a seed for each
        request that brings none)."""
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
