"""The vault: a tool task that the embedded 135M model learns on a CPU in minutes.

Each row is a person with a four-digit vault code. Agent 0 has a ``lookup`` tool that reads
the code's first two digits, agent 1 one that reads its last two. Neither agent can answer
alone: the joint answer, agent 0's two digits and then agent 1's, is what scores, 0.5 for each
half it gets right. An agent that does not look its half up can only guess (1 chance in 90).
The episode is one turn: an agent may make one round of calls, and the message it writes
after the result is its answer (its first message where it called nothing).

The call format is ``lookup(<name>)`` anywhere in a message. The embedded SmolLM2's chat
template ignores ``tools=``, and that model almost never writes the JSON call format, but it
writes this one in 5 to 23% of its samples before any training (3 seeds,
``benchmarks/tool_learning.py``): learning has something to reinforce. A model whose template
renders the tools may also use the Hermes format.

``VaultTask(tools=False)`` is the same task with no tools, the baseline a learning benchmark
compares with (``benchmarks/tool_learning.py``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.environments import Environment, Outcome, Start, ToolCall
from comlrl.environments.tools import parse_tool_calls

NAMES = (
    "Adam Alice Amy Anna Ben Beth Bob Carl Carol Chris Dan Dave Diana Emma Eric Eva Frank Fred Gary Grace "
    "Hank Helen Henry Ian Ivy Jack Jake Jane Jill Jim Joe John Josh Judy Julia Karen Kate Kevin Kim Kyle "
    "Laura Leo Linda Lisa Lucy Luke Mark Mary Max Mia Mike Nancy Nick Nina Noah Olga Oscar Paul Pete Phil "
    "Ray Rita Rob Rose Ruth Ryan Sam Sara Sean Sue Ted Tina Tom Tony Vera Will Zoe Zack Owen Iris"
).split()
"""The people: 64 for training, the last 16 held out."""

TRAIN_SIZE = 64
CALL = re.compile(r"lookup\(\s*[\"']?([^\"')]*?)[\"']?\s*\)")
ANSWER = re.compile(r"(?<!\d)(\d{2})(?!\d)")
HALVES = ("starts", "ends")
"""What agent 0's and agent 1's lookups tell: how the code starts, how it ends."""


def answer(text: str) -> str | None:
    """The two digits an agent answered: the first standalone two-digit number of its message."""
    found = ANSWER.search(text)
    return found.group(1) if found else None


def lookup_tool(agent: int, person: str, half: str) -> Callable[[str], str]:
    """Agent ``agent``'s ``lookup``: ``half`` of ``person``'s code, for that name only."""

    def lookup(name: str) -> str:
        """Read half of a person's vault code.

        Args:
            name: the person's name.
        """
        if name.strip().lower() != person.lower():
            return f"No one named {name} has a vault here."
        return f"{person}'s code {HALVES[agent]} with {half}"

    return lookup


class VaultTask(Environment):
    """Two agents, one ``lookup`` tool each, one four-digit code (see the module's docstring).

    Args:
        tools: give the agents their tools (False: the same task without them).
        seed: the codes' seed (the people and the split are fixed).
    """

    reward_name = "vault"
    max_tool_calls = 1
    tool_instructions = "You find a person's secret code with the tool lookup. Write lookup(name) to call it."

    def __init__(self, tools: bool = True, seed: int = 0):
        self.with_tools = tools
        draw = random.Random(seed)
        self.codes = {name: (str(draw.randint(10, 99)), str(draw.randint(10, 99))) for name in NAMES}

    def dataset(self, split: str) -> list[dict[str, Any]]:
        """The rows of ``split``: ``"train"`` (64 people) or ``"eval"`` (16 others)."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        names = NAMES[:TRAIN_SIZE] if split == "train" else NAMES[TRAIN_SIZE:]
        return [{"name": name, "code": "".join(self.codes[name])} for name in names]

    def reset(self, row: Mapping[str, Any]) -> Start:
        name, code = row["name"], row["code"]
        if not (isinstance(code, str) and len(code) == 4 and code.isdigit()):
            raise ValueError(f"row {name!r} has code {code!r}; expected four digits")
        question = f"What is {name}'s secret code?"
        if self.with_tools:  # the call spelled out: 23 calls in 96 probe samples, against 0-3 in 48 without
            question += f" Write lookup({name}) to read it."
        prompt = [{"role": "user", "content": question}]
        return Start([prompt, prompt], state=(name, code[:2], code[2:]))

    def tools(self, agent: int, state: Any) -> Sequence[Callable[..., str]]:
        if not self.with_tools:
            return ()
        name, *halves = state
        return [lookup_tool(agent, name, halves[agent])]

    def tool_calls(self, agent: int, text: str) -> Sequence[ToolCall]:
        """``lookup(<name>)`` calls, and any in the Hermes format."""
        return parse_tool_calls(text) + [ToolCall("lookup", {"name": name}) for name in CALL.findall(text)]

    def step(self, state: Any, actions: Sequence[str], turn: int) -> Outcome:
        """0.5 for each half of the joint answer that is right."""
        _, *halves = state
        return Outcome(sum(0.5 * (answer(action) == half) for action, half in zip(actions, halves)))
