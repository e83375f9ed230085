"""Chat-format prompts: rows, formatters and environments may give chat messages, which each
agent's own chat template renders; the ids an agent reads are exactly its template's (two
templates, one whose tokenizer adds a BOS by itself), and agents with different tokenizers
each read their own format."""

from unittest import mock

import pytest
import torch

from comlrl.engine.update import PolicyUpdate
from comlrl.environments import Environment, Outcome, Start
from comlrl.rollout.chat import ChatRenderer
from comlrl.rollout.generation import encode_prompts
from comlrl.trainers.reinforce import MAGRPOTrainer
from tests.helpers import chat_tokenizer, length_sum, small_config, tiny_llama

CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
BRACKETS = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


TOKENIZERS = {"chatml": (CHATML, False), "brackets with a BOS": (BRACKETS, True)}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color"}]


def template_ids(tokenizer, messages):
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


@pytest.mark.parametrize("name", TOKENIZERS)
def test_an_agent_reads_exactly_its_templates_ids(name):
    tokenizer = chat_tokenizer(*TOKENIZERS[name])
    text = ChatRenderer(tokenizer, agent=0)(MESSAGES, "a prompt")
    assert encode_prompts(tokenizer, [text])["input_ids"][0].tolist() == template_ids(tokenizer, MESSAGES)
    if name == "brackets with a BOS":  # one BOS: the template's was dropped from the text, the tokenizer adds it
        assert text.startswith("[system]") and template_ids(tokenizer, MESSAGES).count(3) == 1


def test_text_prompts_pass_as_they_are_and_bad_messages_are_named():
    renderer = ChatRenderer(chat_tokenizer(CHATML, False), agent=1)
    assert renderer("plain text", "a prompt") == "plain text"
    with pytest.raises(TypeError, match=r"row 3's prompt: message 1 is 'hi'; expected a dict with a 'role' string"):
        renderer([{"role": "user", "content": "a"}, "hi"], "row 3's prompt")
    with pytest.raises(TypeError, match=r"message 0's content is a int; expected a string"):
        renderer([{"role": "user", "content": 7}], "row 3's prompt")
    with pytest.raises(ValueError, match="row 3's prompt is an empty list of messages"):
        renderer([], "row 3's prompt")
    no_template = chat_tokenizer(CHATML, False)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="agent 0's tokenizer has no chat template"):
        ChatRenderer(no_template, agent=0)(MESSAGES, "row 0's prompt")


def rows_of_messages():
    return [{"prompt": [{"role": "user", "content": f"Name a {thing}"}]} for thing in ("color", "fruit", "tree")]


def system_prompt(text):
    def formatter(row):
        return [{"role": "system", "content": text}, *row["prompt"]]

    return formatter


def test_agents_with_different_templates_each_read_their_own(tmp_path):
    tokenizers = [chat_tokenizer(*TOKENIZERS[name]) for name in TOKENIZERS]
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tok, seed=i) for i, tok in enumerate(tokenizers)],
        tokenizer=tokenizers,
        train_dataset=rows_of_messages(),
        formatters=[system_prompt("You answer."), system_prompt("You check.")],
        reward_func=length_sum,
        args=small_config(tmp_path, per_device_train_batch_size=3),
    )
    with mock.patch.object(PolicyUpdate, "__call__", autospec=True, side_effect=PolicyUpdate.__call__) as update:
        trainer.train()
    turn = update.call_args.args[1].turns[0]
    assert turn.prompts[0][0].startswith("<|system|>You answer.</|>") and turn.prompts[1][0].startswith(
        "[system] You check."
    )
    for i, (tokenizer, text) in enumerate(zip(tokenizers, ["You answer.", "You check."])):
        agent = turn.agents[i]
        for m, row in enumerate(turn.rows):
            messages = system_prompt(text)(rows_of_messages()[row])
            read = agent.prompt_ids[m * 2][agent.prompt_mask[m * 2].bool()].tolist()  # sample 0 of node m
            assert read == template_ids(tokenizer, messages)


class ChatRelay(Environment):
    """An environment whose observations are chat messages."""

    def reset(self, row):
        first = [{"role": "user", "content": row["prompt"][0]["content"]}]
        return Start([first, "plain text for agent 1:"], state=None)

    def step(self, state, actions, turn):
        return Outcome(float(len(actions[0])))


def test_an_environments_observations_may_be_chat_messages(tmp_path):
    tokenizers = [chat_tokenizer(*TOKENIZERS[name]) for name in TOKENIZERS]
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tok, seed=i) for i, tok in enumerate(tokenizers)],
        tokenizer=tokenizers,
        train_dataset=rows_of_messages(),
        environment=ChatRelay(),
        args=small_config(tmp_path, per_device_train_batch_size=3),
    )
    assert trainer.run.train_prompts.prompts == [
        ["<|user|>Name a color</|>\n<|assistant|>", "<|user|>Name a fruit</|>\n<|assistant|>",
         "<|user|>Name a tree</|>\n<|assistant|>"],
        ["plain text for agent 1:"] * 3,
    ]  # fmt: skip
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    trainer.train()
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.agents[0].parameters()))
