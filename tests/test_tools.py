"""Tools per agent: calls read from the text, run (failures become results), their results
appended as the template writes them, the agent continued from the ids it read; only the
agent's own tokens carry gradient (loss, KL, entropy, sampler correction, token counts); and
a MAGRPO run in an environment with a tool per agent."""

import dataclasses
import functools
import json
import time
from types import SimpleNamespace

import pytest
import torch

from comlrl.algorithms import SamplerCorrection, micro_batch_policy_terms
from comlrl.engine.update import PolicyUpdate
from comlrl.environments import Environment, Outcome, Start, ToolCall
from comlrl.environments.acting import AgentTools
from comlrl.environments.tools import ToolRunner, parse_tool_calls, tool_schemas
from comlrl.models.forward import completion_logprobs
from comlrl.rollout.chat import ChatRenderer
from comlrl.rollout.generation import build_rollout, encode_prompts
from comlrl.trainers.reinforce import MAGRPOTrainer
from tests.helpers import IGNORES_TOOLS, chat_tokenizer, log_lines, small_config, tiny_llama

TAKES_TOOLS = "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}" + IGNORES_TOOLS


def population(city: str) -> str:
    """How many people live in a city.

    Args:
        city: the city's name.
    """
    return {"paris": "2 million", "rome": "3 million"}.get(city.lower(), "unknown")


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


# ------------------------------------------------------------------ reading and running calls
def test_calls_are_read_from_the_hermes_format():
    text = f"Let me see. {call('population', city='Paris')} and {call('population', city='Rome')}"
    assert parse_tool_calls(text) == [
        ToolCall("population", {"city": "Paris"}),
        ToolCall("population", {"city": "Rome"}),
    ]
    assert parse_tool_calls("no call here") == []
    bad = parse_tool_calls("<tool_call>{'name': 1}</tool_call> <tool_call>[1]</tool_call>")
    assert [c.error is not None for c in bad] == [True, True] and "not valid JSON" in bad[0].error


def test_a_failing_tool_gives_the_agent_an_error_message():
    def broken(city: str) -> str:
        raise KeyError(city)

    def number(city: str) -> str:
        return 7

    def slow(city: str) -> str:
        time.sleep(1.0)
        return "late"

    runner = ToolRunner(timeout=0.1)
    calls = [ToolCall(name, {"city": "x"}) for name in ("population", "broken", "number", "slow", "missing")]
    results = runner.run([population, broken, number, slow], calls + [ToolCall("", {}, "the call is not valid JSON")])
    runner.close()
    assert results == [
        ("unknown", False),
        ("Error: broken raised KeyError: 'x'", True),
        ("Error: number returned a int, not text.", True),
        ("Error: slow took more than 0.1 s.", True),
        ("Error: there is no tool 'missing'; the tools are ['broken', 'number', 'population', 'slow'].", True),
        ("Error: the call is not valid JSON.", True),
    ]


def test_a_tool_without_a_schema_is_named():
    def undocumented(city):
        return city

    with pytest.raises(ValueError, match="agent 1's tool .*undocumented has no JSON schema"):
        tool_schemas([undocumented], agent=1)


# ------------------------------------------------------------------ the template
MESSAGES = [{"role": "user", "content": "How big is Paris?"}]


def test_tools_reach_the_agent_through_its_template_or_our_instructions():
    schema = tool_schemas([population], agent=0)
    ours = ChatRenderer(chat_tokenizer(IGNORES_TOOLS), agent=0)(MESSAGES, "a prompt", schema)
    assert ours.startswith("<|system|>You can call these tools") and json.dumps(schema[0]) in ours
    theirs = ChatRenderer(chat_tokenizer(TAKES_TOOLS), agent=0)(MESSAGES, "a prompt", schema)
    assert theirs.startswith("TOOLS=") and "You can call these tools" not in theirs
    with pytest.raises(TypeError, match="is text, but agent 0 has tools: give it chat messages"):
        ChatRenderer(chat_tokenizer(IGNORES_TOOLS), agent=0)("plain", "a prompt", schema)


def test_tool_results_follow_as_the_template_writes_them():
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    ids = ChatRenderer(tokenizer, agent=0).tool_turn_ids(["2 million", "3 million"])
    # The agent ended its message with <eos>: what follows is the rest of the template's turn.
    expected = "\n<|tool|>2 million<eos>\n<|tool|>3 million<eos>\n<|assistant|>"
    assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ one agent's turn with tools
def rollout_of(tokenizer, prompts, texts, group, ended=True):
    """The rollout of ``texts`` (``group`` per prompt), each ending with EOS (``ended``; else cut
    at the token budget); prompts may be ids."""
    end = [tokenizer.eos_token_id] if ended else []
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + end for text in texts]
    eos = [tokenizer.eos_token_id]
    return build_rollout(tokenizer, encode_prompts(tokenizer, prompts), ids, group, eos, 2, torch.device("cpu"))


def test_a_completion_goes_on_after_its_calls_results():
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    renderer = ChatRenderer(tokenizer, agent=0)
    first = f"I check. {call('population', city='Paris')}"
    rollout = rollout_of(tokenizer, ["<|user|>How big is Paris?"], [first, "No idea."], group=2)
    seen = []

    def proceed(prompts):
        seen.extend(prompts)
        return rollout_of(tokenizer, prompts, ["About 2 million."], group=1)

    schemas = [tool_schemas([population], 0)]
    turn = AgentTools(renderer, ToolRunner(timeout=5), max_rounds=2)
    acted, calls, errors = turn(rollout, [[population]], schemas, group=2, proceed=proceed)
    assert calls.tolist() == [1.0, 0.0] and errors.tolist() == [0.0, 0.0]
    assert acted.texts == ["About 2 million.", "No idea."]
    first_ids = rollout.completion_ids[0, : int(rollout.completion_mask[0].sum())].tolist()
    tool_ids = renderer.tool_turn_ids(["2 million"])
    answer_ids = tokenizer("About 2 million.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    prompt_ids = rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist()
    assert seen == [prompt_ids + first_ids + tool_ids]  # continued from exactly the ids the agent read
    length = len(first_ids) + len(tool_ids) + len(answer_ids)
    assert acted.completion_ids[0, :length].tolist() == first_ids + tool_ids + answer_ids
    own = [True] * len(first_ids) + [False] * len(tool_ids) + [True] * len(answer_ids)
    assert acted.action_mask[0, :length].tolist() == own and acted.completion_mask[0].sum() == length
    untouched = int(rollout.completion_mask[1].sum())
    assert acted.completion_ids[1, :untouched].tolist() == rollout.completion_ids[1, :untouched].tolist()
    assert acted.action_mask[1].tolist() == acted.completion_mask[1].tolist()


def test_a_message_cut_at_the_token_budget_still_makes_its_whole_calls():
    """A message cut at ``max_new_tokens`` after a whole call: the call runs, and the template's
    end of the message, which the agent did not write, comes before the tool's result."""
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    renderer = ChatRenderer(tokenizer, agent=0)
    cut = f"{call('population', city='Paris')} and then I"
    rollout = rollout_of(tokenizer, ["<|user|>How big is Paris?"], [cut], group=1, ended=False)
    assert rollout.truncated.tolist() == [True]
    seen = []

    def proceed(prompts):
        seen.extend(prompts)
        return rollout_of(tokenizer, prompts, ["About 2 million."], group=1)

    turn = AgentTools(renderer, ToolRunner(timeout=5), max_rounds=1)
    acted, calls, _ = turn(rollout, [[population]], [tool_schemas([population], 0)], group=1, proceed=proceed)
    assert calls.tolist() == [1.0] and acted.texts == ["About 2 million."] and acted.truncated.tolist() == [False]
    tool_ids = renderer.tool_turn_ids(["2 million"], closed=False)
    assert tool_ids[0] == tokenizer.eos_token_id and tool_ids[1:] == renderer.tool_turn_ids(["2 million"])
    cut_ids = tokenizer(cut, add_special_tokens=False)["input_ids"]
    assert seen[0][-len(cut_ids) - len(tool_ids) :] == cut_ids + tool_ids


def test_calls_stop_after_max_rounds():
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    again = f"Again. {call('population', city='Rome')}"
    rollout = rollout_of(tokenizer, ["<|user|>Count:"], [again], group=1)
    rounds = []

    def proceed(prompts):
        rounds.append(len(prompts))
        return rollout_of(tokenizer, prompts, [again], group=1)

    turn = AgentTools(ChatRenderer(tokenizer, 0), ToolRunner(timeout=5), max_rounds=3)
    acted, calls, _ = turn(rollout, [[population]], [tool_schemas([population], 0)], group=1, proceed=proceed)
    assert rounds == [1, 1, 1] and calls.tolist() == [3.0] and acted.texts == [again]


# ------------------------------------------------------------------ only the agent's tokens carry gradient
def test_tool_tokens_carry_no_gradient_by_hand():
    """One completion of 5 tokens whose 3rd and 4th are a tool's result: the loss (policy term
    with the sampler correction, k3 KL, entropy bonus) and its normalisation count tokens 1, 2
    and 5 only, and d loss / d (log-prob, entropy) is 0 at the tool's tokens."""
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    model = tiny_llama(tokenizer)
    rollout = rollout_of(tokenizer, ["<|user|>hi"], ["abcd"], group=1)
    own = torch.tensor([[True, True, False, False, True]])
    rollout = dataclasses.replace(rollout, action_mask=own)
    mask = PolicyUpdate.loss_mask(SimpleNamespace(args=SimpleNamespace(mask_truncated_completions=False)), rollout)
    assert torch.equal(mask, own)
    logps, entropy = completion_logprobs(
        model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
        with_entropy=True,
    )  # fmt: skip
    logps.retain_grad()
    entropy.retain_grad()
    advantage, beta, entropy_coef = 2.0, 0.1, 0.01
    terms = micro_batch_policy_terms(
        logps, torch.tensor([advantage]), mask, torch.tensor([1 / 3]),
        sampler_logps=logps.detach() - 0.3, ref_logps=logps.detach() - 0.5, entropy=entropy,
        beta=beta, entropy_coef=entropy_coef, sampler_correction=SamplerCorrection("token_truncate", 2.0),
    )  # fmt: skip
    terms.loss.loss.backward()
    k3 = torch.exp(torch.tensor(-0.5)) + 0.5 - 1
    per_token = -advantage * torch.exp(torch.tensor(0.3)) + beta * k3 - entropy_coef * entropy.detach()[0]
    expected = per_token[own[0]].sum() / 3
    torch.testing.assert_close(terms.loss.loss.detach(), expected)
    assert (logps.grad[0, 2:4] == 0).all() and (logps.grad[0, own[0]] != 0).all()
    assert (entropy.grad[0, 2:4] == 0).all() and (entropy.grad[0, own[0]] != 0).all()
    assert terms.entropy_kept == 3 and terms.sampler_tokens == 3 and terms.corrected == 0


# ------------------------------------------------------------------ a run with a tool per agent
class Census(Environment):
    """Agent 0 asks about a city, agent 1 answers it; each has one tool."""

    reward_name = "census"

    def reset(self, row):
        question = [{"role": "user", "content": f"Ask about {row['city']}."}]
        return Start([question, [{"role": "user", "content": "Answer questions."}]], state=row["city"])

    def tools(self, agent, state):
        return [population] if agent == 1 else [lambda_free_tool]

    def step(self, state, actions, turn):
        return Outcome(float("2 million" in actions[1]))


def lambda_free_tool(topic: str) -> str:
    """Says what is known about a topic.

    Args:
        topic: what to look up.
    """
    return f"{topic}: nothing"


class ScriptedBackend:
    """Agent 1 first calls its tool on every sample, then answers after the result; agent 0 asks."""

    def __init__(self, tokenizers):
        self.tokenizers = tokenizers
        self.continued = []

    def generate(self, agent, prompts, num_generations, sampling, generator=None):
        tokenizer = self.tokenizers[agent]
        if agent == 1 and all(isinstance(p, str) for p in prompts):
            texts = [call("population", city="Paris")] * (len(prompts) * num_generations)
        elif agent == 1:
            self.continued.append(len(prompts))
            texts = [f"It has {k} million." for k in range(len(prompts))]
        else:
            texts = [f"How big is it {k}?" for k in range(len(prompts) * num_generations)]
        return rollout_of(tokenizer, prompts, texts, num_generations)

    def uses_generators(self, sampling):
        return True

    def sync_weights(self, agent):
        pass


def test_magrpo_trains_agents_with_a_tool_each(tmp_path):
    tokenizers = [chat_tokenizer(IGNORES_TOOLS), chat_tokenizer(TAKES_TOOLS)]
    rows = [{"city": c} for c in ("Paris", "Rome", "Oslo")]
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tok, seed=i) for i, tok in enumerate(tokenizers)],
        tokenizer=tokenizers,
        train_dataset=rows,
        environment=Census(),
        args=small_config(tmp_path, per_device_train_batch_size=3),
    )
    assert "You can call these tools" in trainer.run.train_prompts.prompts[0][0]  # ours, for agent 0
    assert trainer.run.train_prompts.prompts[1][0].startswith("TOOLS=")  # agent 1's template takes them
    backend = ScriptedBackend(tokenizers)
    object.__setattr__(trainer.run, "rollout", trainer.run.rollout.with_backend(backend))
    before = [p.detach().clone() for p in trainer.agents[1].parameters()]
    trainer.train()
    assert backend.continued == [6]  # one batched continuation of agent 1's 3 rows x 2 samples
    line = log_lines(tmp_path / "run", "metrics.jsonl")[-1]
    assert line["agent1/tool_calls"] == 1.0 and line["agent1/tool_call_frac"] == 1.0 and line["agent1/tool_errors"] == 0
    assert line["agent0/tool_calls"] == 0.0 and line["turn_1/tool_calls"] == 0.5
    assert line["reward/census/mean"] == pytest.approx(1 / 6)  # one of the 6 answers says "2 million"
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.agents[1].parameters()))


class Lookups(Census):
    """Calls in a format of its own, for a model too small for JSON: a line "LOOKUP <city>"."""

    tool_instructions = "Write LOOKUP and a city's name on a line to learn its population.\n{schemas}"

    def tool_calls(self, agent, text):
        return [
            ToolCall("population", {"city": line.split()[1]})
            for line in text.splitlines()
            if line.startswith("LOOKUP ")
        ]


def test_an_environment_may_read_calls_in_its_own_format(tmp_path):
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    environment = Lookups()
    rollout = rollout_of(tokenizer, ["<|user|>How big?"], ["LOOKUP Rome", "no"], group=2)
    parse = functools.partial(environment.tool_calls, 1)
    turn = AgentTools(ChatRenderer(tokenizer, 1), ToolRunner(timeout=5), 1, parse)
    acted, calls, _ = turn(
        rollout,
        [[population]],
        [tool_schemas([population], 1)],
        2,
        lambda prompts: rollout_of(tokenizer, prompts, ["3 million"], 1),
    )
    assert calls.tolist() == [1.0, 0.0] and acted.texts == ["3 million", "no"]
    rendered = ChatRenderer(tokenizer, 1)(
        MESSAGES, "a prompt", tool_schemas([population], 1), environment.tool_instructions
    )
    assert rendered.startswith("<|system|>Write LOOKUP and a city's name") and '"name": "population"' in rendered
    bad = AgentTools(ChatRenderer(tokenizer, 1), ToolRunner(timeout=5), 1, lambda text: "LOOKUP Rome")
    with pytest.raises(TypeError, match="tool_calls returned 'LOOKUP Rome'; expected a list of ToolCall, or None"):
        bad(rollout, [[population]], [tool_schemas([population], 1)], 2, lambda prompts: rollout)


def test_the_samplers_log_probs_follow_the_agents_own_tokens():
    """bf16 or vLLM sampling keeps the sampler's log-probs: after a tool's result they are the
    continuation's, and 0 on the result's tokens (which the loss never counts)."""
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    rollout = rollout_of(tokenizer, ["<|user|>How big?"], [call("population", city="Rome")], group=1)
    first = int(rollout.completion_mask[0].sum())
    rollout = dataclasses.replace(
        rollout, sampler_logprobs=-torch.arange(1.0, rollout.completion_ids.shape[1] + 1)[None]
    )

    def proceed(prompts):
        more = rollout_of(tokenizer, prompts, ["ok"], 1)
        return dataclasses.replace(more, sampler_logprobs=torch.full(more.completion_ids.shape, -0.5))

    turn = AgentTools(ChatRenderer(tokenizer, 0), ToolRunner(timeout=5), 1)
    acted, _, _ = turn(rollout, [[population]], [tool_schemas([population], 0)], 1, proceed)
    tool = len(ChatRenderer(tokenizer, 0).tool_turn_ids(["3 million"]))
    logprobs = acted.sampler_logprobs[0].tolist()
    assert logprobs[:first] == [-float(k) for k in range(1, first + 1)]
    assert logprobs[first : first + tool] == [0.0] * tool and logprobs[first + tool : first + tool + 3] == [-0.5] * 3
