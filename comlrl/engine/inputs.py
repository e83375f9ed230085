"""What a trainer is given besides its config, declared once for every trainer: the agents,
the data, the reward and the hooks. Each trainer class names the optional inputs it also
takes (:attr:`~comlrl.engine.base.MultiAgentTrainer.optional_inputs`: critics, a
centralized adapter, a training reward); an input of another trainer is refused by name.
Positional calls are read in :mod:`comlrl.compat.arguments`, before anything here."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from comlrl.environments.base import Environment
from comlrl.utils.checks import field_default, is_real

CRITIC_INPUTS = frozenset({"critic_model", "critics", "critic_tokenizer"})
"""The inputs of trainers with critics (IAC, MAAC; MARLHF with ``rl_algorithm`` iac / maac)."""


@dataclass(frozen=True, kw_only=True)
class TrainerInputs:
    """A trainer's arguments other than ``args`` (its config)."""

    agent_model: Any = None
    """A model folder or hub id to load ``num_agents`` copies of (with ``model_config`` as
    ``from_pretrained`` keyword arguments), instead of ``agents``; given with ``agents``, each
    of those must be this model."""
    agents: Sequence[Any] | None = None
    """The agents, one causal LM each (any N >= 1; they may be different architectures with
    different tokenizers): a model instance, or a folder or hub id to load."""
    num_agents: int | None = None
    """How many copies of ``agent_model`` to load (default: the config's ``num_agents``, else
    2); with ``agents``, it must match their count. Centralized trainers: the roles."""
    tokenizer: Any = None
    """One tokenizer for all agents, a list with one per agent, or None to load each agent's
    tokenizer from where the agent was loaded."""
    model_config: Mapping[str, Any] | None = None
    """``from_pretrained`` keyword arguments used with ``agent_model`` (e.g. ``{"dtype":
    "bfloat16", "attn_implementation": "sdpa"}``), and the sections ``model_kwargs``,
    ``tokenizer_kwargs`` and ``special_tokens`` (added to every agent's tokenizer; a model
    loaded by name that its tokenizer outgrows is resized to it, one passed in is an error)."""
    train_dataset: Any = None
    """Rows (a ``datasets.Dataset`` or a list of dicts)."""
    eval_dataset: Any = None
    """Rows scored by ``evaluate()``."""
    reward_func: Any = None
    """Scores joint actions: called with one list of completions per agent (N positional
    arguments), or with the prompts first when it takes N+1; returns, per joint action, one
    number shared by all agents or a sequence of N numbers (one per agent). The prompts are
    agent 0's prompt of the joint action's turn as it saw it (its formatted prompt; at later
    turns the prompt the transition produced). A function that names ``batch_items`` gets the
    dataset row (dict) of each joint action, one that names ``prompts`` gets them by keyword
    when they are not positional, and one with ``**kwargs`` gets both. A function that names
    ``turn``, ``prompt_history_per_agent`` or ``response_history_per_agent`` among its keyword
    parameters also gets those (``comlrl.rewards.joint_reward.REWARD_CONTEXT``). The config's
    ``reward_call`` says whether a function scores the K joint actions of a turn in one call
    or one joint action per call (one-element lists); the default, ``auto``, tells them apart
    by what they return. A list of such functions is summed with the config's ``reward_weights``."""
    reward_processor: Callable[[float], float] | None = None
    """``float -> float`` applied to each reward (see ``RewardProcessors``)."""
    formatters: Any = None
    """Maps a row to an agent's prompt; one callable for all agents or a list with one per
    agent. Default: the row's ``prompt`` column."""
    external_transition: Callable[..., Sequence[str] | None] | None = None
    """For ``num_turns > 1``: called after each turn on each branch with the keyword arguments
    it names among ``prompt`` (the row's prompt), ``agent_completions`` (the joint action just
    taken, one text per agent), ``num_agents``, ``prompt_history_per_agent``,
    ``response_history_per_agent`` (every turn so far, the one just played included), ``row``
    and ``turn``; returns the next turn's prompt of every agent, or None to end the branch."""
    wandb_config: Mapping[str, Any] | None = None
    """Turns on W&B logging: ``wandb.init`` arguments (``project``, ``entity``, ``name``, ...).
    Needs ``pip install 'comlrl[wandb]'``."""
    eval_logger: Callable[..., Any] | None = None
    """Evaluation hook, called with the keyword arguments it names among
    ``agent_completions_turns`` (``[agent][row][turn]`` texts), ``prompts``, ``rows``,
    ``test_cases`` and ``entry_points`` (the rows' ``test`` / ``entry_point`` columns); returns
    a dict of metrics, or anything ``eval_aggregator`` turns into one."""
    eval_aggregator: Callable[..., dict[str, float]] | None = None
    """``eval_aggregator(eval_logger_output, num_turns=...) -> dict``."""
    peft_config: Any = None
    """Train LoRA adapters instead of whole models: a ``peft`` config (e.g. ``LoraConfig``)
    for every agent, or a list with one per agent (needs ``pip install 'comlrl[lora]'``).
    With ``agent_model``, or with the same model object passed for every agent, the agents
    share ONE frozen base model, each with its own adapter."""
    metrics_callback: Callable[[list[Any]], dict[str, float]] | None = None
    """``metrics_callback(samples) -> dict``, metrics of your own from agent samples
    (:class:`~comlrl.metrics.hooks.RolloutSample`: ``agent_idx``, ``prompt``, ``completion``,
    ``reward``, ``returns``, ``advantage``, ``metadata``): called with every training
    rollout's samples (its numbers logged beside ours), and in ``evaluate()`` with each row's
    (averaged over the rows, logged as ``eval/<key>``; an evaluation sample's ``advantage`` is
    NaN). Trainers whose steps sample nothing (MADPO) call it in ``evaluate()`` only."""
    train_reward_func: Callable[..., Sequence[Any]] | None = None
    """Scores the training rollouts in place of ``reward_func``: called with all the joint
    actions of a turn at once, its values used as returned (no ``reward_processor``, no
    ``reward_weights``), while ``reward_func`` still scores ``evaluate()``. None:
    ``reward_func`` scores both. (The policy-gradient and actor-critic trainers.)"""
    centralized_comparator_adapter: Any = None
    """Centralized collaboration (one model writes every role): joins the roles' prompts into
    the model's prompt and splits its responses into roles (default
    :class:`~comlrl.engine.centralized.TaggedCentralizedComparatorAdapter`). MADPO,
    MARLHF and their iterative trainers: also the adapter of a comparator that writes every
    agent's part (``comparator_generation_mode="centralized"``)."""
    critic_model: Any = None
    """A separate critic model: a folder or hub id (loaded once per critic with
    ``model_config``), or a causal LM instance when there is one critic."""
    critics: Sequence[Any] | None = None
    """Separate critic models, a list with one per critic: causal LM instances, folders or hub
    ids. With ``critic_model`` too, every entry must name ``critic_model``'s model, and
    ``critics`` is used."""
    critic_tokenizer: Any = None
    """The separate critics' tokenizer (one, or one per critic); None loads each critic's from
    where it was loaded, or takes its agent's (MAAC: agent 0's) when that folder holds none."""
    environment: Any = None
    """An :class:`~comlrl.environments.Environment`: starts each dataset row's episode (each
    agent's first prompt) and plays every joint action (its reward, the next prompts or the
    end), in place of ``reward_func``, ``formatters`` and ``external_transition``; ``num_turns``
    is then the longest an episode may go. (The MAGRPO family and the actor-critic trainers.)"""

    @classmethod
    def of(cls, trainer_class: type, named: dict[str, Any]) -> TrainerInputs:
        """The inputs of a call of ``trainer_class`` (a trainer class) by keyword; an input it does
        not take is a TypeError naming it (and the trainers that take it)."""
        taken = COMMON_INPUTS | trainer_class.optional_inputs
        for name in named:
            if name not in taken:
                raise TypeError(f"{trainer_class.__name__}() got an unexpected keyword argument {name!r}{owners(name)}")
        return cls(**named)

    def replace(self, **changes: Any) -> TrainerInputs:
        return dataclasses.replace(self, **changes)


OPTIONAL_INPUTS = CRITIC_INPUTS | {"train_reward_func", "centralized_comparator_adapter", "environment"}
"""The inputs only some trainers take (each says which: ``optional_inputs``)."""

COMMON_INPUTS = frozenset(spec.name for spec in fields(TrainerInputs)) - OPTIONAL_INPUTS
"""The inputs every trainer takes."""


def owners(name: str) -> str:
    """What the error about an input ``name`` a trainer does not take adds: who takes it."""
    if name in CRITIC_INPUTS:
        return f" ({name} is an input of the trainers with critics: IACTrainer, MAACTrainer, MARLHFTrainer)"
    if name == "centralized_comparator_adapter":
        return " (the centralized trainers take it: CentralizedMAGRPOTrainer, MADPOTrainer, MARLHFTrainer)"
    if name == "train_reward_func":
        return " (the policy-gradient and actor-critic trainers take it)"
    if name == "environment":
        return " (the MAGRPO family and the actor-critic trainers take it)"
    return ""


def call_signature(order: Sequence[str], trainer_class: type) -> inspect.Signature:
    """What ``inspect.signature(trainer_class)`` shows: the positional ``order``, then every other
    input the trainer takes, by keyword only."""
    taken = COMMON_INPUTS | trainer_class.optional_inputs | {"args"}
    positional = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for n in order]
    keyword = [
        inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=None)
        for spec in fields(TrainerInputs)
        if spec.name in taken and spec.name not in order
    ]
    return inspect.Signature(positional + keyword)


def check_required_inputs(args: Any, inputs: TrainerInputs) -> None:
    """The inputs every run needs, and a transition only where there are turns to go to; with
    an ``environment``, none of what it replaces."""
    if inputs.train_dataset is None:
        raise ValueError("train_dataset is required")
    if inputs.environment is not None:
        check_environment_inputs(args, inputs)
        return
    if inputs.reward_func is None:
        raise ValueError("reward_func is required (or an environment=)")
    if args.num_turns > 1 and inputs.external_transition is None:
        raise ValueError(
            f"num_turns={args.num_turns} needs external_transition=, a function that writes each "
            "agent's next-turn prompt from the joint action just taken"
        )
    if args.num_turns == 1 and inputs.external_transition is not None:
        raise ValueError(
            "external_transition is given but num_turns=1, so it would never be called (the default is "
            "num_turns=1; older comlrl versions defaulted to 2): set num_turns=2 (or more) in the config, "
            "or drop external_transition"
        )


ENVIRONMENT_REPLACES = {
    "reward_func": "its step returns the reward",
    "reward_processor": "its step returns the reward to train on",
    "train_reward_func": "its step returns the reward",
    "formatters": "its reset writes each agent's first prompt",
    "external_transition": "its step writes the next prompts",
}
"""The inputs an ``environment`` replaces, and why."""

ENVIRONMENT_CONFIG = {
    "early_termination_threshold": "the environment ends an episode by returning no observations",
    "external_prompt_passthrough": "the environment's observations are the agents' prompts as they are",
    "reward_weights": "the environment returns one reward",
    "reward_call": "the environment's step is called once per joint action",
}
"""Config fields of the reward function and the transition, which mean nothing with an environment."""


def check_environment_inputs(args: Any, inputs: TrainerInputs) -> None:
    """An environment, and nothing given or set that it replaces."""
    if not isinstance(inputs.environment, Environment):
        raise TypeError(
            f"environment must be an instance of a subclass of comlrl.environments.Environment, got "
            f"{type(inputs.environment).__name__}"
        )
    environment = inputs.environment
    calls = environment.max_tool_calls
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"{type(environment).__name__}.max_tool_calls must be an integer >= 1, got {calls!r}")
    timeout = environment.tool_timeout
    if not (is_real(timeout) and 0 < timeout < float("inf")):
        raise ValueError(f"{type(environment).__name__}.tool_timeout must be a number of seconds > 0, got {timeout!r}")
    for name, why in ENVIRONMENT_REPLACES.items():
        if getattr(inputs, name) is not None:
            raise ValueError(f"{name} is given with environment=, which replaces it ({why}): drop {name}")
    for name, why in ENVIRONMENT_CONFIG.items():
        if getattr(args, name) != field_default(args, name):
            raise ValueError(f"{name}={getattr(args, name)!r} is set with environment= ({why}): leave it unset")
