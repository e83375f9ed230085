"""What each agent of the code task is told: its role, the request, and the code its answer starts with.

Prompts end by opening a Python code block that starts the agent's code: ``def aux(`` for
the helper; for the main agent, the problem's preamble and the entry point's ``def`` without
its docstring (the request shows the whole problem), after which it writes the body. An
agent's code ends at the first closing fence or new statement at the left margin
(``scoring.ANSWER_ENDS``) and is trimmed to its longest prefix of whole lines that parses
(``complete_prefix``: answers cut by ``max_new_tokens`` lose their unfinished end, not
everything). With a tokenizer that has a chat template the role is the system message, the
request the user's, and the opening starts the assistant's answer; without one (base models)
they are plain text in that order.

Apart from the task because this is the wording alone: tuning what a model is told changes
this file and no rule of the reward or the evaluation.
"""

from __future__ import annotations

from typing import Any

HELPER_NAME = "aux"
"""The helper agent's function, which the main agent may call."""
FENCE = "```"

HELPER_ROLE = (
    "You are the helper in a team of two Python programmers. Write one small helper function named "
    f"`{HELPER_NAME}` that would be useful for solving the problem below. Your partner writes the main "
    f"function and may call `{HELPER_NAME}`. Write only `{HELPER_NAME}`, short: no docstring, no other "
    "function, no tests, no explanation."
)
MAIN_ROLE = (
    "You are the main programmer in a team of two. Complete the function below. Your partner writes a "
    f"helper function `{HELPER_NAME}` that you may call. Write only the function's body, short: no docstring, "
    "no tests, no explanation."
)
MAIN_REQUEST = "Write the body of `{entry_point}`."
"""What the main (or single) agent is asked after the problem's code; ``{entry_point}`` is its function."""
SINGLE_ROLE = (
    "Complete the Python function below. Write only the function's body, short: no docstring, no tests, no explanation."
)


def _chat_or_plain(role: str, problem: str, answer_start: str, tokenizer: Any) -> str:
    """The role as the system message (it also replaces a template's default system text,
    tokens a small model's prompt is better without), the problem as the user's, and the
    answer's start; plain text in that order for a tokenizer without a chat template."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": role}, {"role": "user", "content": problem}]
        chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return chat + answer_start
    return f"{role}\n\n{problem}\n\n{answer_start}"


FEEDBACK = (
    "Your team ran its program on the problem's tests: {feedback}\nYour part of it:\n{fence}python\n{code}\n{fence}\n"
    "Write your part again, better."
)
"""The second turn's request (the MAGRPO paper's multi-turn setting): the team's test results and
the agent's own code of the first turn."""
