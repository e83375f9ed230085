"""The ``vllm`` generation backend: one vLLM engine per agent, beside it on its GPU.

Install with ``pip install 'comlrl[vllm]'``; needs a CUDA GPU. Each engine is built from its
agent's weights as they are when training starts, and :meth:`VLLMBackend.sync_weights` copies
the agent's weights into it after every update (all its optimizer steps of a training step),
so completions always come from the policy being trained. Prompts are tokenized with the
agent's own tokenizer and the result is laid out exactly as
:func:`comlrl.rollout.generation.generate_group` lays out the Hugging Face backend's, so the
trainer cannot tell the two apart.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from comlrl.rollout.decoding import generation_default
from comlrl.rollout.generation import AgentRollout, build_rollout, completion_eos_ids, encode_prompts

SUPPORTED_SAMPLING = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "min_new_tokens",
    "repetition_penalty",
    "eos_token_id",
    "pad_token_id",
)
"""The Hugging Face ``generate`` arguments this backend can reproduce with vLLM."""

_INSTALL = "pip install 'comlrl[vllm]'"


def vllm_sampling_kwargs(sampling: dict[str, Any], num_generations: int, eos_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments equivalent to Hugging Face ``generate``'s
    ``sampling`` (a trainer's ``SamplingSpec.generate_kwargs()``), for ``num_generations`` samples.

    Greedy decoding asks for one completion (vLLM refuses ``n > 1`` without sampling; the G
    greedy completions are identical anyway). Completions stop at exactly ``eos_ids``
    (``ignore_eos`` keeps vLLM from also stopping at the tokenizer's EOS when the caller
    chose others), and ``min_tokens`` holds those same ids back, as Hugging Face does.
    """
    unsupported = sorted(set(sampling) - set(SUPPORTED_SAMPLING))
    if unsupported:
        raise ValueError(
            f"generation_backend='vllm' cannot apply the generation arguments {unsupported}; "
            f"supported: {list(SUPPORTED_SAMPLING)}. Remove them from generation_kwargs or use "
            "generation_backend='hf'"
        )
    if "max_new_tokens" not in sampling:
        raise ValueError("generation_backend='vllm' needs max_new_tokens in the sampling arguments")
    greedy = not sampling.get("do_sample", False)
    return {
        "n": 1 if greedy else num_generations,
        "temperature": 0.0 if greedy else float(sampling.get("temperature", 1.0)),
        "top_p": 1.0 if greedy else float(sampling.get("top_p", 1.0)),
        # Hugging Face turns top-k off with 0; -1 is "off" in every vLLM release (0 only in newer ones).
        "top_k": -1 if greedy or not sampling.get("top_k") else int(sampling["top_k"]),
        "max_tokens": int(sampling["max_new_tokens"]),
        "min_tokens": int(sampling.get("min_new_tokens", 0)),
        "repetition_penalty": float(sampling.get("repetition_penalty", 1.0)),
        "stop_token_ids": list(eos_ids),
        "ignore_eos": True,
        # Texts are decoded here with the agent's tokenizer, as the hf backend decodes them.
        "detokenize": False,
    }


def prompt_token_ids(encoded: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each prompt's token ids without the left padding: what vLLM is given."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]


def agent_cuda_device(agent: torch.nn.Module, index: int) -> torch.device:
    """The CUDA device agent ``index`` sits on: its engine goes there too."""
    device = next(agent.parameters()).device
    if device.type != "cuda":
        raise ValueError(
            f"agent {index} is on {device}, but generation_backend='vllm' runs each agent's engine on the "
            f"agent's own GPU: move agent {index} to a CUDA device (model.to('cuda')) or use generation_backend='hf'"
        )
    return device


def _load_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on the engine's worker, in this process: vLLM's model maps the Hugging Face
    parameter names onto its own (fused) layout and copies the values in place."""
    worker.model_runner.model.load_weights(weights=weights)


@contextlib.contextmanager
def _engine_placement(device: torch.device) -> Iterator[None]:
    """Build an engine inside this process, on ``device``.

    vLLM's ``external_launcher`` executor (what TRL's colocate mode uses) runs the engine in
    the calling process rather than a subprocess, so :meth:`VLLMBackend.sync_weights` can
    reach its model, and reads torchrun's variables: ``LOCAL_RANK`` names the GPU; the others
    describe the process group, and are torchrun's own when it launched us (data
    parallelism), else those of a one-process world. They are restored afterwards, and so is
    the current CUDA device, which vLLM sets.
    """
    values = {"LOCAL_RANK": str(device.index)}
    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        values[name] = os.environ.get(name, default)
    values["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(_free_port())
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        with torch.cuda.device(device):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VLLMBackend:
    """One ``vllm.LLM`` per agent, on the agent's GPU, with the agent's dtype; the engines take
    ``gpu_memory_utilization`` of their GPU each, the rest stays for training.

    The engines run one at a time, even when agents on different GPUs are served from
    different threads: vLLM keeps the state of the forward pass under way in module globals,
    which two engines of one process running at once would overwrite.
    """

    def __init__(
        self,
        agents: Sequence[torch.nn.Module],
        tokenizers: Sequence[Any],
        adapters: Sequence[str | None],
        gpu_memory_utilization: float,
    ):
        try:
            import vllm
        except ImportError as error:
            raise ImportError(
                f"generation_backend='vllm' needs vLLM, which is not installed: {_INSTALL} "
                "(it needs a CUDA GPU), or use generation_backend='hf'"
            ) from error
        if not torch.cuda.is_available():
            raise ValueError(
                "generation_backend='vllm' needs a CUDA GPU and none is available; use generation_backend='hf'"
            )
        lora = [i for i, adapter in enumerate(adapters) if adapter is not None]
        if lora:
            raise ValueError(
                f"agents {lora} train LoRA adapters, which the vllm backend does not support yet; "
                "use generation_backend='hf'"
            )
        self.vllm = vllm
        self.agents, self.tokenizers = agents, tokenizers
        self.devices = [agent_cuda_device(agent, i) for i, agent in enumerate(agents)]
        # vLLM loads a model from a folder: each engine starts from a copy of its agent saved
        # here, kept as long as the backend (the engine may read the folder again).
        self._folder = tempfile.TemporaryDirectory(prefix="comlrl-vllm-")
        self._lock = threading.Lock()
        self.engines = [self._build_engine(i, gpu_memory_utilization) for i in range(len(agents))]

    def _build_engine(self, index: int, gpu_memory_utilization: float) -> Any:
        agent = self.agents[index]
        folder = os.path.join(self._folder.name, f"agent_{index}")
        agent.save_pretrained(folder)
        self.tokenizers[index].save_pretrained(folder)
        with _engine_placement(self.devices[index]):
            return self.vllm.LLM(
                model=folder,
                dtype=str(next(agent.parameters()).dtype).removeprefix("torch."),
                gpu_memory_utilization=gpu_memory_utilization,
                distributed_executor_backend="external_launcher",
                # Eager mode: no compilation or CUDA-graph capture, so each engine starts quickly.
                enforce_eager=True,
            )

    def generate(
        self,
        agent: int,
        prompts: list[str],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        model, tokenizer = self.agents[agent], self.tokenizers[agent]
        eos_ids = completion_eos_ids(sampling, model, tokenizer)
        # No top_k (the config's None): the model's generation_config decides, as with generate.
        sampling = {"top_k": generation_default(model, "top_k"), **sampling}
        kwargs = vllm_sampling_kwargs(sampling, num_generations, eos_ids)
        encoded = encode_prompts(tokenizer, prompts)
        # One seed per prompt from the agent's generator, so a seeded run samples the same
        # completions again; vLLM gives sample k of a prompt seed + k, hence the stride.
        greedy = kwargs["temperature"] == 0
        device = "cpu" if generator is None else generator.device
        base = None if greedy else int(torch.randint(0, 2**31 - 1, (), generator=generator, device=device).item())
        seeds = [None if greedy else base + b * kwargs["n"] for b in range(len(prompts))]
        params = [self.vllm.SamplingParams(**kwargs, seed=seed) for seed in seeds]
        with self._lock, torch.cuda.device(self.devices[agent]):
            outputs = self.engines[agent].generate(
                [{"prompt_token_ids": ids} for ids in prompt_token_ids(encoded)], params, use_tqdm=False
            )
        repeat = num_generations // kwargs["n"]  # G copies of the one greedy completion
        completions = [list(c.token_ids) for request in outputs for c in request.outputs for _ in range(repeat)]
        pad_id = sampling.get("pad_token_id", tokenizer.pad_token_id)
        device = next(model.parameters()).device
        return build_rollout(tokenizer, encoded, completions, num_generations, eos_ids, pad_id, device)

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        return True

    def sync_weights(self, agent: int) -> None:
        """Copy agent ``agent``'s current weights into its engine, and drop the engine's cached
        prompt prefixes: their keys and values were computed with the old weights."""
        engine = self.engines[agent]
        weights = list(self.agents[agent].state_dict().items())
        with self._lock, torch.cuda.device(self.devices[agent]):
            engine.collective_rpc(_load_weights, args=(weights,))
            engine.reset_prefix_cache()
