"""comlrl 1.4.3's public trainer attributes, read with the meaning they had there.

1.4.3's trainers kept what they were built from as attributes (``trainer.tokenizers``,
``trainer.reward_func``, ``trainer.optimizers``, ...) and scripts read them after building or
training. Our trainers hold the same things in other places (``trainer.agents`` carries the
tokenizers, ``trainer.learners`` the optimizers, ``trainer.inputs`` the arguments as given);
the mixins here are read-only properties over those, each documented with its 1.4.3 meaning,
so nothing is stored twice. An attribute whose meaning cannot be kept raises a
:class:`~comlrl.compat.moved.MovedNameError` (an AttributeError) that names what to read instead.

:class:`TrainerAttributes` is every trainer's; :class:`IACAttributes`,
:class:`MAACAttributes`, :class:`PreferenceAttributes`, :class:`IterativeAttributes` and
:class:`MARLHFAttributes` add what only those trainers had. Nothing here imports the trainers.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import torch

from comlrl.compat.moved import MovedNameError


def refused(name: str, instead: str) -> property:
    """A property for 1.4.3's attribute ``name`` whose meaning is gone: reading it raises a
    MovedNameError saying ``instead`` (what to read here), so ``hasattr`` is False."""

    def read(self: Any) -> NoReturn:
        raise MovedNameError(f"{type(self).__name__}.{name} was comlrl 1.4.3's; {instead}", name=name)

    return property(read, doc=f"Not kept (comlrl 1.4.3's): {instead}")


def identity(value: float) -> float:
    """1.4.3's ``reward_processor`` when none was given."""
    return value


def model_name_of(source: Any) -> str:
    """What 1.4.3 called a model source: a folder or hub id as given; for a model object its
    config's ``model_type`` (else ``_name_or_path``), else its class name."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    config = getattr(source, "config", None)
    name = getattr(config, "model_type", None) or getattr(config, "_name_or_path", None)
    return str(name) if name else type(source).__name__


def first_device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


class _ConfigClass:
    """``default_config_cls``, on the class and its instances: the class's ``config_class``."""

    def __get__(self, instance: Any, owner: type) -> type:
        return owner.config_class


class TrainerAttributes:
    """What every 1.4.3 trainer (MAGRPO and its family, IAC, MAAC, MADPO, MARLHF) kept."""

    inputs: Any
    """The trainer's arguments as given (:class:`~comlrl.engine.inputs.TrainerInputs`)."""

    default_config_cls = _ConfigClass()
    """1.4.3: the config class built when ``args`` is not given (here ``config_class``)."""

    @property
    def tokenizers(self) -> list[Any]:
        """1.4.3: one tokenizer per agent (one given for all: that one, repeated)."""
        return self.agents.tokenizers

    @property
    def tokenizer(self) -> Any:
        """1.4.3: the tokenizer given for all agents, else agent 0's."""
        return self.agents.tokenizers[0]

    @property
    def model_name(self) -> str:
        """1.4.3: the agents' model: ``agent_model`` (or ``agents[0]``) as given, a model object's model type."""
        inputs = self.inputs
        return model_name_of(inputs.agent_model if inputs.agent_model is not None else inputs.agents[0])

    @property
    def reward_func(self) -> Any:
        """1.4.3: the reward function given."""
        return self.inputs.reward_func

    @property
    def reward_processor(self) -> Any:
        """1.4.3: the reward processor given, else the identity."""
        return self.inputs.reward_processor or identity

    @property
    def formatters(self) -> list[Any]:
        """1.4.3: one prompt formatter per agent (the default reads the row's ``prompt``)."""
        return self.train_prompts.formatters

    @property
    def train_dataset(self) -> Any:
        """1.4.3: the training dataset given."""
        return self.inputs.train_dataset

    @property
    def eval_dataset(self) -> Any:
        """1.4.3: the evaluation dataset given, or None."""
        return self.inputs.eval_dataset

    @property
    def model_config(self) -> Any:
        """1.4.3: the ``model_config`` given, else ``{}``."""
        return self.inputs.model_config or {}

    @property
    def eval_logger(self) -> Any:
        """1.4.3: the ``eval_logger`` given, or None."""
        return self.inputs.eval_logger

    @property
    def eval_aggregator(self) -> Any:
        """1.4.3: the ``eval_aggregator`` given, or None."""
        return self.inputs.eval_aggregator

    @property
    def external_transition(self) -> Any:
        """1.4.3: the ``external_transition`` given, or None."""
        return self.inputs.external_transition

    @property
    def centralized_collaboration(self) -> Any:
        """1.4.3: with one model writing every role, what joins the roles' prompts and splits its answers; else None."""
        return self.collaboration

    @property
    def parallel_training(self) -> str:
        """1.4.3: ``"none"`` or ``"mp"`` (one thread per agent), the config's ``parallel_training``."""
        return self.args.parallel_training

    @property
    def advantage_mode(self) -> str:
        """1.4.3 (MAGRPO family, MARLHF): the group baseline (``mean``, ``raw``, ``max``, ``rloo``)."""
        mode = getattr(self.objective.config, "advantage_mode", None)
        if mode is None:
            raise MovedNameError(
                f"{type(self).__name__}.advantage_mode: this trainer's loss has no group baseline",
                name="advantage_mode",
            )
        return mode

    @property
    def device(self) -> torch.device:
        """1.4.3: agent 0's device."""
        return self.agents.device(0)

    @property
    def agent_devices(self) -> list[torch.device]:
        """1.4.3: each agent's device."""
        return [self.agents.device(i) for i in range(len(self.agents))]

    @property
    def reference_models(self) -> list[torch.nn.Module]:
        """1.4.3: each agent's frozen copy of its initial weights for the KL terms; [] without them."""
        return [reference for reference in self.agents.references if reference is not None]

    @property
    def reference_devices(self) -> list[torch.device]:
        """1.4.3: each reference model's device; [] without them."""
        return [first_device(reference) for reference in self.reference_models]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """1.4.3: each agent's optimizer (an AdamW), in agent order."""
        return self.learner_optimizers("agent")

    def learner_optimizers(self, kind: str) -> list[torch.optim.Optimizer]:
        """The optimizers of the learners named ``"<kind> <i>"`` (``agent`` or ``critic``), in order."""
        if self.learners.waiting:
            raise MovedNameError(
                f"{type(self).__name__}'s optimizers are made when train() starts (their learning-rate schedule's "
                "length waits for what train() makes first): read trainer.learners.optimizers after train()",
                name="optimizers",
            )
        learners = self.learners
        return [opt for name, opt in zip(learners.names, learners.optimizers) if name.split(" ")[0] == kind]

    env_step = refused(
        "env_step",
        "steps are counted in training steps here: read trainer.global_step (every metric is logged at it)",
    )
    dist_env = refused(
        "dist_env",
        "read trainer.parallel (is_main: rank 0, rank, world_size) and trainer.device",
    )
    rollout_buffers = refused(
        "rollout_buffers",
        "rollouts are not buffered: each training step samples and learns from its own; "
        "pass metrics_callback= to see every rollout's samples",
    )
    wandb_initialized = refused(
        "wandb_initialized",
        "W&B starts when train() starts, when wandb_config is given: read wandb.run",
    )
    verbose = refused(
        "verbose",
        "wandb_config's config_sections.output.verbose is not read here: train() always shows its progress bar "
        "and writes metrics every logging_steps steps",
    )


class IACAttributes:
    """What 1.4.3's IACTrainer added: per-agent critics' optimizers and devices."""

    @property
    def agent_optimizers(self) -> list[torch.optim.Optimizer]:
        """1.4.3: each agent's optimizer, in agent order."""
        return self.learner_optimizers("agent")

    @property
    def critic_optimizers(self) -> list[torch.optim.Optimizer]:
        """1.4.3: each critic's optimizer (here also a value head's on its agent, held by the agent's in 1.4.3)."""
        return self.learner_optimizers("critic")

    @property
    def critic_devices(self) -> list[torch.device]:
        """1.4.3: each critic's device."""
        return [first_device(critic.backbone) for critic in self.critics]

    @property
    def critic_type(self) -> str:
        """1.4.3: ``"v"`` (values of prompts) or ``"q"`` (of prompts with completions), the config's ``critic_type``."""
        return (self.args.critic_type or "v").lower()


class MAACAttributes:
    """What 1.4.3's MAACTrainer added: the one centralized critic's optimizer and device."""

    @property
    def agent_optimizers(self) -> list[torch.optim.Optimizer]:
        """1.4.3: each agent's optimizer, in agent order."""
        return self.learner_optimizers("agent")

    @property
    def critic_optimizer(self) -> torch.optim.Optimizer:
        """1.4.3: the centralized critic's optimizer."""
        return self.learner_optimizers("critic")[0]

    @property
    def critic_device(self) -> torch.device:
        """1.4.3: the centralized critic's device."""
        return first_device(self.critics[0].backbone)


class PreferenceAttributes:
    """What 1.4.3's MADPO and MARLHF trainers (and their iterative ones) added."""

    @property
    def centralized_comparator_adapter(self) -> Any:
        """1.4.3: what joins the roles' prompts and splits a joint answer: the adapter given or in use, else None."""
        if self.collaboration is not None:
            return self.collaboration.adapter
        return self.comparator_adapter


class IterativeAttributes:
    """What 1.4.3's MADPOIter and MARLHFIter trainers added."""

    target_seed = refused(
        "target_seed",
        "every round's random streams (the comparator's included) are seeded from the config's seed and the round "
        "(comlrl.trainers.dpo.rounds.round_generator): read trainer.args.seed",
    )
    comparator_seed = refused(
        "comparator_seed",
        "the comparator samples from its own stream of each round, seeded from the config's seed and the round "
        "(comlrl.trainers.dpo.rounds.round_generator): read trainer.args.seed",
    )


class MARLHFAttributes:
    """What 1.4.3's MARLHFTrainer added: the critics given and the reward model's tokenizer and device."""

    @property
    def critic_model_source(self) -> Any:
        """1.4.3: the ``critic_model`` given, or None."""
        return self.inputs.critic_model

    @property
    def critic_sources(self) -> Any:
        """1.4.3: the ``critics`` given, or None."""
        return self.inputs.critics

    @property
    def reward_tokenizer(self) -> Any:
        """1.4.3: the reward model's tokenizer; None before the reward model is fitted (or read back)."""
        model = self.reward_model
        return None if model is None else model.tokenizer

    @property
    def reward_device(self) -> torch.device:
        """1.4.3: where the reward model lives (the config's ``reward_model_device``; here default agent 0's)."""
        return torch.device(self.reward_source.device())

    reward_optimizer = refused(
        "reward_optimizer",
        "the reward model's optimizer lives only while it is fitted, in train(); the fitted model is frozen "
        "(trainer.reward_model). Its settings are the config's reward_learning_rate and reward_train_batch_size",
    )
