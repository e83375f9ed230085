"""comlrl 1.4.3's public helpers of ``comlrl.utils`` that scripts call themselves, with their
signatures and results, over this library's own parts: ``build_formatters`` (a row -> prompt
callable per agent), ``call_reward_function`` (one call of a reward function as the trainers
make it), ``resolve_tokenizers`` (the agents' tokenizers, able to pad) and
``read_checkpoint_metadata`` (what a checkpoint says before a trainer resumes from it).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import AutoTokenizer

from comlrl.checkpoint import read_state
from comlrl.checkpoint.files import STATE_FILE
from comlrl.models.loading import resolve_tokenizers as padded_tokenizers
from comlrl.rewards.joint_reward import reward_keywords, takes_prompts
from comlrl.utils.per_agent import per_agent
from comlrl.utils.signatures import keyword_arguments

Formatter = Callable[..., str]


# ------------------------------------------------------------------------------------------
# formatters
# ------------------------------------------------------------------------------------------
def _default_formatter(item: Mapping[str, Any], external_prompts: Any = None) -> str:
    return external_prompts if external_prompts is not None else item.get("prompt", "")


def _with_external_prompts(formatter: Formatter, pass_none: bool) -> Formatter:
    """``formatter`` called as ``f(item, external_prompts=None)``: the prompts reach it when it
    names ``external_prompts`` (and, unless ``pass_none``, only when they are not None)."""
    if not keyword_arguments(formatter, ("external_prompts",)):
        return lambda item, external_prompts=None: formatter(item)

    def call(item: Mapping[str, Any], external_prompts: Any = None) -> str:
        if external_prompts is None and not pass_none:
            return formatter(item)
        return formatter(item, external_prompts=external_prompts)

    return call


def build_formatters(
    formatters: Formatter | Sequence[Formatter] | None, num_agents: int, *, pass_none_external_prompts: bool = True
) -> list[Formatter]:
    """One ``f(item, external_prompts=None) -> str`` per agent: ``formatters`` (one for all, or one
    per agent), else the row's ``prompt`` (``external_prompts`` when given)."""
    if formatters is None:
        return [_default_formatter] * num_agents
    if not callable(formatters) and (isinstance(formatters, str | bytes) or not isinstance(formatters, Sequence)):
        raise ValueError("formatters must be None, a callable, or a sequence of callables.")
    given = per_agent(formatters if callable(formatters) else list(formatters), num_agents, "formatters")
    return [_with_external_prompts(f, pass_none_external_prompts) for f in given]


# ------------------------------------------------------------------------------------------
# reward functions
# ------------------------------------------------------------------------------------------
def call_reward_function(
    reward_func: Callable[..., Any],
    prompts: Sequence[str],
    agent_completions: Sequence[Sequence[str]],
    *,
    num_agents: int,
    batch_items: Sequence[Mapping[str, Any]] | None = None,
    signature: inspect.Signature | None = None,
) -> list[float]:
    """One call of ``reward_func`` as the trainers make it (the prompts first when it takes N+1
    positional parameters; ``batch_items`` and ``prompts`` by keyword when it names them or takes
    ``**kwargs``), its result as a list of floats.

    ``signature`` is accepted for 1.4.3's callers, which passed ``inspect.signature(reward_func)``:
    the function's own signature decides. Where 1.4.3 guessed (one positional parameter for N > 1
    agents got the list of lists; a TypeError retried with the completions alone), the signature
    that fits neither call is a TypeError naming it.
    """
    with_prompts = takes_prompts(reward_func, num_agents)
    keywords = {"batch_items": batch_items, "prompts": list(prompts)}
    names = [n for n in reward_keywords(reward_func, with_prompts) if keywords[n] is not None]
    args = ([list(prompts)] if with_prompts else []) + [list(c) for c in agent_completions]
    output = reward_func(*args, **{name: keywords[name] for name in names})
    if isinstance(output, torch.Tensor):
        output = output.detach().cpu().tolist()
    values = list(output) if isinstance(output, list | tuple) else [output]
    return [float(value) for value in values]


# ------------------------------------------------------------------------------------------
# tokenizers
# ------------------------------------------------------------------------------------------
def _is_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes) and not callable(value)


def _padding(tokenizers: list[Any]) -> list[Any]:
    """The tokenizers, each able to pad (with its EOS token when it has no pad token; said once)."""
    return padded_tokenizers(tokenizers, tokenizers)


def _loaded(name: Any) -> Any:
    return AutoTokenizer.from_pretrained(name)


def resolve_tokenizers(model: Any, tokenizer: Any, agents: Sequence[Any] | None) -> Any:
    """The trainer's tokenizer (``agents`` None) or tokenizers: ``tokenizer`` (one for all, or a
    list of one per agent), else loaded from ``model`` or from ``agents`` given by name."""
    if agents is None:
        if tokenizer is not None and not _is_list(tokenizer):
            return _padding([tokenizer])[0]
        if not isinstance(model, str | os.PathLike):
            raise ValueError("Tokenizer must be provided when model is a PreTrainedModel instance.")
        return _padding([_loaded(model)])[0]
    if tokenizer is None:
        if _is_list(agents) and all(isinstance(source, str) for source in agents):
            return _padding([_loaded(name) for name in agents])
        raise ValueError("Tokenizer(s) must be provided when agents are model objects.")
    if _is_list(tokenizer):
        if len(tokenizer) != len(agents):
            raise ValueError("tokenizers length must match agents.")
        return _padding(list(tokenizer))
    return _padding([tokenizer])[0]


# ------------------------------------------------------------------------------------------
# checkpoints
# ------------------------------------------------------------------------------------------
ORIGINAL_STATE_FILE = "training_state.pt"
"""comlrl 1.4.3's checkpoint state file, which this library does not resume from."""


def read_checkpoint_metadata(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """What a checkpoint of this library (a ``checkpoint-{step}`` folder, or its ``trainer_state.json``)
    says before a trainer resumes from it, under comlrl 1.4.3's keys:

    - ``trainer_class``: the class that wrote it (``"IACTrainer"``); None for a checkpoint older
      than that record;
    - ``sequence``: its step, the number in its folder name (1.4.3 numbered its checkpoints so);
    - ``version``, ``run_id`` and ``wandb``: None. Checkpoints here carry no format version, run
      identity or W&B run; 1.4.3 gave None for the last two on older checkpoints too. A W&B run
      is continued with ``wandb_config={"id": ..., "resume": "allow"}``.
    """
    path = os.path.expanduser(os.fspath(checkpoint))
    if os.path.basename(path) in (STATE_FILE, ORIGINAL_STATE_FILE):
        path = os.path.dirname(path)
    if not os.path.isfile(os.path.join(path, STATE_FILE)) and os.path.isfile(os.path.join(path, ORIGINAL_STATE_FILE)):
        raise ValueError(
            f"{path} is a comlrl 1.4.3 checkpoint ({ORIGINAL_STATE_FILE}); this library resumes only its own "
            f"(checkpoint-<step>/ folders holding {STATE_FILE}): start from its saved models instead"
        )
    state = read_state(path)
    return {
        "version": None,
        "trainer_class": None if state.trainer is None else state.trainer.split("-")[0] + "Trainer",
        "sequence": state.global_step,
        "run_id": None,
        "wandb": None,
    }
