"""N agents acting in one environment: the protocol the rollout tree plays.

An episode starts from a dataset row (:meth:`Environment.reset`: a state and each agent's
first observation) and goes turn by turn: every agent acts, and the joint action takes the
episode one step (:meth:`Environment.step`: a reward, each agent's next observation, the next
state, or the end).

**Forking: a state value, not a live object.** The rollout tree plays G samples per agent at
every node, so ONE node's state is stepped by every joint action that leaves it (G aligned,
G**N cross). ``step`` therefore takes the state and returns the next one, and must not change
the state it was given: a state is a value (a string, a tuple, a frozen dataclass, a dict that
``step`` copies before changing). That keeps an environment pure and easy to test (``step``
twice on one state gives two independent branches), and costs nothing where states are small;
an explicit ``fork()`` would put the copying, and the bugs of forgetting it, in every
environment. An environment whose state holds something that cannot be copied (a process, a
connection) keeps it outside the state, keyed by a value the state holds.

**One path.** The trainer's ``reward_func`` and ``external_transition`` are one such
environment (:class:`~comlrl.environments.functions.RewardAndTransition`), so every tree,
return and advantage is computed the same way whatever the task.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from comlrl.environments.tools import ToolCall
from comlrl.rewards.joint_reward import RewardBatch
from comlrl.rollout.chat import TOOL_INSTRUCTIONS
from comlrl.rollout.generation import AgentRollout


@dataclass(frozen=True)
class Start:
    """Where an episode, or the branch of one joint action, goes on from."""

    observations: Sequence[str]
    """Each agent's next prompt (its first, from :meth:`Environment.reset`)."""
    state: Any = None
    """The environment's state there (a value: see the module's docstring)."""


@dataclass(frozen=True)
class Outcome:
    """What one joint action did (:meth:`Environment.step`)."""

    reward: float | Sequence[float]
    """One number shared by the agents, or one per agent."""
    observations: Sequence[str] | None = None
    """Each agent's next prompt; None ends the episode on this branch."""
    state: Any = None
    """The next state (ignored when the episode ends)."""


@dataclass(frozen=True)
class JointActions:
    """The K joint actions of one turn, over every node of a tree level, as the tree plays them."""

    turn: int
    """The turn they were taken at (1 for the first)."""
    row_ids: list[int]
    """The dataset row of each."""
    states: list[Any]
    """The state of the node each leaves (one state is shared by the joint actions of its node)."""
    actions: list[list[str]]
    """``[k][agent]`` each agent's completion."""
    nodes: list[int]
    """The node of each, numbered within the turn; each node's joint actions are consecutive."""
    num_joint: int
    """J: joint actions per node."""
    prompt_history: list[list[list[str]]]
    """``[k][agent]`` the agent's prompts on this branch, turns 1 to this one."""
    response_history: list[list[list[str]]]
    """``[k][agent]`` the agent's completions on this branch, this turn's included."""
    last: bool
    """The tree goes no deeper: no next observations are wanted."""


@dataclass(frozen=True)
class Acted:
    """The agents' completions of one turn after their tool calls (:mod:`comlrl.environments.tools`)."""

    rollouts: list[AgentRollout]
    """One per agent; a completion that called tools holds their results (not its own tokens)."""
    tool_calls: Tensor | None = None
    """``(N, M*G)`` calls each completion made; None: no agent has tools."""
    tool_errors: Tensor | None = None
    """``(N, M*G)`` of those, the calls that failed (an error message was the result)."""


Proceed = Callable[[int, list[list[int]]], AgentRollout]
"""``proceed(agent, prompts)``: one continuation by ``agent`` of each prompt given as token ids."""


@dataclass(frozen=True)
class Played:
    """What the environment made of one turn's joint actions."""

    rewards: RewardBatch
    """The K joint actions' rewards (each function's, weighted, processed)."""
    next: list[Start | None]
    """Per joint action, where its branch goes on, or None where it ends."""
    transition_calls: int = 0
    """Calls made to write next observations (a metric)."""


class TreeEnvironment(Protocol):
    """What the rollout tree plays, batched over a tree level: an :class:`Environment` on a
    dataset's rows (:class:`~comlrl.environments.played.EnvironmentOnRows`), or the reward
    function and transition (:class:`~comlrl.environments.functions.RewardAndTransition`)."""

    def start(self, row_ids: Sequence[int]) -> list[Start]:
        """Each row's first observations and state."""
        ...

    def play(self, batch: JointActions) -> Played:
        """The rewards and next starts of one turn's joint actions."""
        ...

    def act(self, rollouts: list[AgentRollout], states: list[Any], group: int, proceed: Proceed) -> Acted:
        """Every agent's completions at nodes of states ``states`` (``group`` per node), after
        the tool calls they make."""
        ...


class Environment(abc.ABC):
    """An environment for N agents: subclass it with :meth:`reset` and :meth:`step`, and pass
    an instance as ``environment=`` to a trainer. Its rows are the training (and evaluation)
    dataset's. ``reset`` must be a function of the row: it is called once per row before
    training (to check every row and measure the prompts), then at the start of every episode."""

    reward_name: str = "environment"
    """Logged as ``reward/{reward_name}/mean``."""
    max_tool_calls: int = 2
    """Rounds of tool calls an agent may make within one turn (every call of one message runs in one round)."""
    tool_timeout: float = 10.0
    """Seconds a tool call may run before its result is an error."""

    tool_instructions: str = TOOL_INSTRUCTIONS
    """How the tools and the call format are described to an agent whose chat template ignores
    ``tools=`` (``{schemas}``: the tools' JSON schemas, one per line)."""

    def tool_calls(self, agent: int, text: str) -> Sequence[ToolCall] | None:
        """The tool calls in agent ``agent``'s message ``text``, for a call format of your own
        (describe it in :attr:`tool_instructions`); None (the default): the tokenizer's
        ``parse_response`` where it has a ``response_template``, else the Hermes format
        (:func:`~comlrl.environments.tools.parse_tool_calls`)."""
        return None

    def tools(self, agent: int, state: Any) -> Sequence[Callable[..., str]]:
        """Agent ``agent``'s tools at a node of state ``state`` (none by default): functions with
        type hints and a docstring with an ``Args:`` section (their JSON schema), returning text.
        A tool that reads the state is a closure over it, and must not change it. An agent with
        tools needs chat-format observations (the schemas go into its chat template)."""
        return ()

    @abc.abstractmethod
    def reset(self, row: Mapping[str, Any]) -> Start:
        """The episode of dataset row ``row``: each agent's first prompt, and the first state."""

    @abc.abstractmethod
    def step(self, state: Any, actions: Sequence[str], turn: int) -> Outcome:
        """Take the agents' ``actions`` (one completion each) at ``turn`` from ``state``
        (without changing it): the reward, and the next observations and state or the end."""
