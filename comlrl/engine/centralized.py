"""Centralized collaboration: ONE model writes every role's output in one tagged response.

Centralized MAGRPO is MAGRPO with one agent, and the centralized modes of MADPO and MARLHF
are theirs with one agent: every one is set up by :class:`CentralizedSetup`. Only the ends of the rollout change: the
agent's prompt asks for every role at once, and its response is split into roles before the
user's reward function sees it, so that function is written exactly as for MAGRPO with one
model per role:

    row ─one formatter per role─▶ role prompts ─adapter.build_prompt─▶ one joint prompt
    ─the one model─▶ G joint responses ─adapter.parse_completion─▶ one text per role
    ─reward_func (one list per role, as MAGRPO calls it)─▶ joint reward ─▶ MAGRPO's update

Sampling, clipping, KL, loss types, LoRA, checkpoints, metrics and evaluation are MAGRPO's.
The adapter (:class:`CentralizedComparatorAdapter`, comlrl 1.4.3's name) says how the joint
prompt reads and how a response splits; :class:`TaggedCentralizedComparatorAdapter`, the
default, asks for ``<agent_i>``...``</agent_i>`` sections.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from comlrl.engine.config import TrainerConfig
from comlrl.engine.inputs import TrainerInputs
from comlrl.metrics.evaluation import EvalHooks
from comlrl.metrics.hooks import RolloutSample
from comlrl.rewards import JointReward
from comlrl.rollout.prompts import Formatter, PromptTable, prompt_column
from comlrl.rollout.tree import Turn
from comlrl.utils import stats as metric_stats
from comlrl.utils.per_agent import per_agent
from comlrl.utils.signatures import describe
from comlrl.utils.stats import Stat
from comlrl.utils.text import short_repr

__all__ = [
    "CentralizedCollaboration",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedSetup",
    "TaggedCentralizedComparatorAdapter",
]

PARSE_FAILURE_METRIC = "centralized/parse_failure_frac"
"""Share of joint responses the adapter could not split (each scored as empty roles)."""


# ------------------------------------------------------------------------------------------
# the adapter: one prompt for every role, one response split into roles
# ------------------------------------------------------------------------------------------
class CentralizedComparatorParseError(ValueError):
    """A joint response holds no role's output at all; the trainer scores it as empty roles."""


class CentralizedComparatorAdapter(Protocol):
    """How one model is asked for every role's output, and how its answer is split."""

    def build_prompt(self, row: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """One prompt asking for the output of every role, from each role's own prompt."""
        ...

    def parse_completion(self, completion: str, row: dict[str, Any], num_agents: int) -> Sequence[str]:
        """``num_agents`` texts, one per role; raises :class:`CentralizedComparatorParseError`
        when the response cannot be split at all."""
        ...


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """Asks for each role's output inside ``<agent_i>``...``</agent_i>`` (i from 0) and reads
    them back: the first such section of each role, letter case and spaces inside the
    brackets ignored, stripped; a role without a section gets ""."""

    def build_prompt(self, row: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        count = len(agent_prompts)
        tasks = "\n\n".join(f"Task of agent {i}:\n{prompt}" for i, prompt in enumerate(agent_prompts))
        sections = "\n".join(f"<agent_{i}>\n(output of agent {i})\n</agent_{i}>" for i in range(count))
        return (
            f"You write the outputs of {count} agents yourself, one output per agent.\n"
            "Answer each agent's task as that agent would, keep the outputs apart, "
            "and write nothing outside the tags.\n\n"
            f"{tasks}\n\n"
            f"Reply with exactly these sections, in this order:\n{sections}\n"
        )

    def parse_completion(self, completion: str, row: dict[str, Any], num_agents: int) -> list[str]:
        sections = [_tagged_section(completion, i) for i in range(num_agents)]
        if all(section is None for section in sections):
            raise CentralizedComparatorParseError(
                f"no <agent_i>...</agent_i> section (i from 0 to {num_agents - 1}) in {short_repr(completion)}"
            )
        return ["" if section is None else section for section in sections]


def _tagged_section(text: str, index: int) -> str | None:
    """The stripped text of the first ``<agent_{index}>``...``</agent_{index}>`` in ``text``."""
    pattern = rf"<\s*agent_{index}\s*>(.*?)<\s*/\s*agent_{index}\s*>"
    match = re.search(pattern, text, flags=re.IGNORECASE | re.DOTALL)
    return None if match is None else match.group(1).strip()


# ------------------------------------------------------------------------------------------
# the collaboration: where the one agent's text meets the per-role world
# ------------------------------------------------------------------------------------------
class CentralizedCollaboration:
    """Joins the roles' prompts into the one agent's prompt and splits its responses into
    roles, for the reward, the metrics callback and ``eval_logger``; nothing else in the
    trainer knows there are roles.

    Args:
        adapter: builds the joint prompt and splits responses.
        formatters: each role's prompt from a row: one callable for every role, a list with one
            per role, or None (the row's ``prompt`` column).
        num_roles: how many roles the one model writes.
    """

    def __init__(self, adapter: CentralizedComparatorAdapter, formatters: Any, num_roles: int):
        for method in ("build_prompt", "parse_completion"):
            if not callable(getattr(adapter, method, None)):
                raise TypeError(
                    f"centralized_adapter {type(adapter).__name__} has no {method}() method; an adapter needs "
                    "build_prompt(row, agent_prompts) -> str and parse_completion(completion, row, num_agents) "
                    "-> one str per role (see TaggedCentralizedComparatorAdapter)"
                )
        self.adapter = adapter
        self.num_roles = num_roles
        self.formatters: list[Formatter] = per_agent(
            prompt_column if formatters is None else formatters, num_roles, "formatters"
        )

    def role_prompts(self, row: dict[str, Any]) -> list[str]:
        """Each role's prompt of ``row``; a formatter's failure names its role."""
        prompts = []
        for role, formatter in enumerate(self.formatters):
            try:
                prompts.append(formatter(row))
            except Exception as error:
                raise RuntimeError(
                    f"formatter {describe(formatter)} of role {role} raised {type(error).__name__}: {error}"
                ) from error
        return prompts

    def joint_prompt(self, row: dict[str, Any]) -> str:
        """The one agent's prompt: the adapter's prompt from every role's prompt (its formatter)."""
        prompt = self.adapter.build_prompt(row, self.role_prompts(row))
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"centralized_adapter {type(self.adapter).__name__}.build_prompt returned {short_repr(prompt)}; "
                "it must return the non-empty prompt the model answers"
            )
        return prompt

    def parse(self, completion: str, row: dict[str, Any]) -> list[str] | None:
        """The roles' texts of one joint response, or None when the adapter cannot split it.
        Anything other than ``num_roles`` strings is the adapter's bug, and an error."""
        try:
            texts = self.adapter.parse_completion(completion, row, self.num_roles)
        except CentralizedComparatorParseError:
            return None
        name = f"centralized_adapter {type(self.adapter).__name__}.parse_completion"
        if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
            raise TypeError(f"{name} returned {short_repr(texts)}; expected a list of {self.num_roles} strings")
        if len(texts) != self.num_roles or not all(isinstance(text, str) for text in texts):
            raise ValueError(f"{name} returned {short_repr(texts)}; expected {self.num_roles} strings (one per role)")
        return list(texts)

    def split(self, completion: str, row: dict[str, Any]) -> list[str]:
        """The roles' texts of one joint response; one the adapter cannot split counts as
        empty roles (the model gets that reward for it, as in comlrl 1.4.3)."""
        texts = self.parse(completion, row)
        return [""] * self.num_roles if texts is None else texts

    def parse_failures(self, completions: Sequence[str], rows: Sequence[dict[str, Any]]) -> int:
        """How many of the joint responses (each with its row) the adapter cannot split."""
        return sum(self.parse(text, row) is None for text, row in zip(completions, rows))

    def parse_failure_stats(self, turn: Turn, table: PromptTable) -> dict[str, Stat]:
        """``centralized/parse_failure_frac`` of a rollout turn of the one agent (its rows in
        ``table``): every centralized trainer logs the share of its samples scored as empty
        roles, so a model that ignores the adapter's format is seen early."""
        texts = turn.agents[0].texts
        per_node = len(texts) // turn.num_nodes
        rows = [table.rows[row] for row in turn.rows for _ in range(per_node)]
        return {PARSE_FAILURE_METRIC: metric_stats.mean(self.parse_failures(texts, rows), len(texts))}

    def split_turns(self, joint_turns: list[list[str]], rows: Sequence[dict[str, Any]]) -> list[list[list[str]]]:
        """``[row][turn]`` joint responses as ``[role][row][turn]`` role texts (``eval_logger``'s layout)."""
        split = [[self.split(text, row) for text in turns] for turns, row in zip(joint_turns, rows)]
        return [[[texts[role] for texts in turns] for turns in split] for role in range(self.num_roles)]

    def role_rewards(self, reward_func: Any, call: str) -> list[RoleReward] | None:
        """Each of the user's reward functions as a reward of the one agent (None stays None,
        for the trainer to say it is required)."""
        if reward_func is None:
            return None
        funcs = list(reward_func) if isinstance(reward_func, list | tuple) else [reward_func]
        return [RoleReward(func, self, call) for func in funcs]

    def role_samples(self, callback: Callable[[list[RolloutSample]], Any] | None) -> Callable | None:
        """``metrics_callback`` given one sample per role (``agent_idx`` the role, ``completion``
        its text; prompt, reward, return and advantage the joint response's), as in 1.4.3."""
        if callback is None:
            return None

        def per_role(samples: list[RolloutSample]) -> Any:
            return callback(
                [
                    dataclasses.replace(sample, agent_idx=role, completion=text)
                    for sample in samples
                    for role, text in enumerate(self.split(sample.completion, sample.metadata["batch_item"]))
                ]
            )

        per_role.__name__ = describe(callback)  # errors name the user's callback
        return per_role


class RoleReward:
    """One of the user's reward functions as a reward of the one agent.

    The trainer's :class:`~comlrl.rewards.JointReward` calls it as a one-agent reward function
    (the joint responses, ``batch_items``); it splits each response into roles and hands them
    to a ``JointReward`` over the roles, which calls the user's function as MAGRPO would with
    one model per role: one list per role, role 0's prompt, the rows, ``reward_call``'s way,
    and the single-turn ``turn`` and histories to a function that names them. Weights and the
    ``reward_processor`` are applied by the trainer's reward, once, to what this returns.
    """

    reward_call = "batch"  # the trainer's reward calls it in batch; the user's function is called as `call` says

    def __init__(self, func: Callable, collaboration: CentralizedCollaboration, call: str):
        self.roles = JointReward(func, collaboration.num_roles, call=call)
        self.collaboration = collaboration
        self.__name__ = describe(func)  # logged as reward/<name>/mean, as MAGRPO logs it

    def __call__(self, completions: list[str], *, batch_items: list[dict[str, Any]]) -> list[float]:
        collaboration = self.collaboration
        texts = [collaboration.split(text, row) for text, row in zip(completions, batch_items)]
        prompts = [collaboration.role_prompts(row) for row in batch_items]
        context = {
            "turn": 1,
            "prompt_history_per_agent": [[[prompt] for prompt in role_prompts] for role_prompts in prompts],
            "response_history_per_agent": [[[text] for text in role_texts] for role_texts in texts],
        }
        # A reward function is not given the rows' dataset indices, so the inner reward's
        # errors name joint actions (and their "dataset row") by position in this call.
        positions = list(range(len(completions)))
        scored = self.roles(
            [role_prompts[0] for role_prompts in prompts],
            [list(role) for role in zip(*texts)],
            positions,
            context,
            batch_items,
        )
        return self._shared(scored.raw)

    def _shared(self, raw: Any) -> list[float]:
        """``(K, roles)`` rewards as one per joint action: one model gets one reward, so
        different rewards for the roles of one joint action are an error."""
        differs = (raw != raw[:, :1]).any(dim=1).nonzero().flatten().tolist()
        if differs:
            k = differs[0]
            raise ValueError(
                f"reward_func {self.__name__} returned per-role rewards {raw[k].tolist()} for joint action {k}; "
                "centralized training gives its one model one reward per joint action: return one value "
                "shared by the roles"
            )
        return raw[:, 0].tolist()


class RoleEvalHooks:
    """The trainer's ``eval_logger`` / ``eval_aggregator`` hooks, given each role's texts
    (``[role][row][turn]``) instead of the joint responses, plus the evaluation's parse
    failures (``eval/centralized/parse_failure_frac``)."""

    def __init__(self, hooks: EvalHooks, collaboration: CentralizedCollaboration):
        self.hooks = hooks
        self.collaboration = collaboration

    def __call__(
        self,
        agent_completions_turns: list[list[list[str]]],
        rows: list[dict[str, Any]],
        prompts: list[str],
        num_turns: int,
    ) -> dict[str, float]:
        joint = agent_completions_turns[0]  # the one agent's [row][turn] responses
        texts = [text for turns in joint for text in turns]
        text_rows = [row for turns, row in zip(joint, rows) for _ in turns]
        failures = self.collaboration.parse_failures(texts, text_rows)
        metrics = self.hooks(self.collaboration.split_turns(joint, rows), rows, prompts, num_turns)
        metrics[f"eval/{PARSE_FAILURE_METRIC}"] = failures / max(len(texts), 1)
        return metrics


# ------------------------------------------------------------------------------------------
# the set-up every centralized trainer shares
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CentralizedSetup:
    """A multi-agent trainer in centralized mode: what the engine's set-up reads in place of
    the user's inputs (one agent, whose prompt is the joint prompt and whose reward and metrics
    callback see roles), and the collaboration the run keeps. Every
    centralized trainer (centralized MAGRPO; MADPO and MARLHF with
    ``collaboration_mode="centralized"``) is built through it, so the roles meet the one model
    in one place.
    """

    collaboration: CentralizedCollaboration
    config: TrainerConfig
    """The user's config, whose ``num_agents`` counts the roles."""
    inputs: TrainerInputs
    """The user's inputs as those of one agent that writes the joint response: its
    ``num_agents``, ``reward_func``, ``formatters`` and ``metrics_callback``."""
    base_config: TrainerConfig
    """The config the set-up reads, which counts one model (``num_agents=1``)."""

    @classmethod
    def build(
        cls, config: TrainerConfig, inputs: TrainerInputs, trainer_name: str, one_model_per_role: str
    ) -> CentralizedSetup:
        """The set-up from the user's ``inputs``; ``trainer_name`` (how errors name it) and
        ``one_model_per_role`` (what to use instead) word the errors."""
        if inputs.external_transition is not None:
            raise ValueError(
                f"{trainer_name} does not support multi-turn episodes, so it takes no external_transition: drop it"
            )
        num_roles = role_count(inputs.num_agents, config.num_agents)
        check_one_model(inputs.agents, num_roles, trainer_name, one_model_per_role)
        adapter = inputs.centralized_comparator_adapter or TaggedCentralizedComparatorAdapter()
        collaboration = CentralizedCollaboration(adapter, inputs.formatters, num_roles)
        one_agent = inputs.replace(
            num_agents=1,
            reward_func=collaboration.role_rewards(inputs.reward_func, config.reward_call),
            formatters=collaboration.joint_prompt,
            metrics_callback=collaboration.role_samples(inputs.metrics_callback),
        )
        return cls(collaboration, config, one_agent, dataclasses.replace(config, num_agents=1))


def role_count(num_agents: int | None, configured: int | None) -> int:
    """The number of roles from the trainer's ``num_agents`` and the config's (default 2)."""
    if None not in (num_agents, configured) and num_agents != configured:
        raise ValueError(
            f"num_agents={num_agents} but the config's num_agents={configured} (both count the roles here): "
            "set one, or make them agree"
        )
    count = configured if num_agents is None else num_agents
    if count is None:
        return 2
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_agents (the number of roles) must be an integer >= 1, got {count!r}")
    return count


def refuse_unused_adapter(adapter: Any, config: Any) -> None:
    """An adapter given where ``config`` has no joint answer for it to split (one model per
    agent, and no comparator writing for every agent): an error naming what to do, never ignored."""
    if adapter is not None and not config.uses_adapter:
        raise ValueError(
            f"centralized_comparator_adapter is given, but collaboration_mode={config.collaboration_mode!r} (one "
            "model per agent), where there is no joint response to split: set collaboration_mode='centralized' in "
            "the config for one model that writes every role, or drop the adapter"
        )


def check_one_model(agents: Any, num_roles: int, trainer_name: str, one_model_per_role: str) -> None:
    """``agents``, when given as a list, must hold exactly one model; the error names
    ``trainer_name`` and says what to do for one model per role (``one_model_per_role``)."""
    if isinstance(agents, Sequence) and not isinstance(agents, str | bytes) and len(agents) != 1:
        raise ValueError(
            f"{trainer_name} trains ONE model that writes all {num_roles} roles, but agents holds "
            f"{len(agents)} models: pass agents=[model] or agent_model=<folder or hub id> (num_agents counts "
            f"the roles); for one model per role, {one_model_per_role}"
        )
