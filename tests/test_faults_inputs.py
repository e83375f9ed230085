"""Bad input refused where it enters, naming it: ``generation_kwargs`` keys and values (when
the config is made, or the trainer built, not at the first ``generate``), text no tokenizer
can encode on every path user text takes to one, and numbers given as strings in every
numeric field of every config."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import LogitsProcessorList

import comlrl.trainers.actor_critic
import comlrl.trainers.dpo
import comlrl.trainers.reinforce.centralized
import comlrl.trainers.reinforce.variants  # noqa: F401  (every config class defined)
from comlrl.engine.config import TrainerConfig
from comlrl.rollout.sampling import SHADOWED
from comlrl.rollout.vllm_sampling import SUPPORTED_SAMPLING
from comlrl.trainers.dpo.joint_comparator import split_answer
from comlrl.trainers.reinforce import MAGRPOConfig

from .helpers import DATA, char_tokenizer, make_trainer, multi_turn_trainer, small_config

SURROGATE = "\ud800"
LONE_SURROGATE = r"cannot be tokenized: character \d+ is '\\ud800', a lone surrogate"


# ------------------------------------------------------------------------------ generation_kwargs
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_beams": "x"}, r"generation_kwargs\['num_beams'\] must be an integer, got the string 'x' \(str\)"),
        ({"num_beams": "4"}, r"generation_kwargs\['num_beams'\] must be an integer, got the string '4' .*write 4"),
        ({"num_beams": 2.0}, r"generation_kwargs\['num_beams'\] must be an integer, .*got 2.0 \(float\)"),
        ({"num_beams": True}, r"generation_kwargs\['num_beams'\] must be an integer, .*got True \(bool\)"),
        ({"repetition_penalty": "1.1"}, r"generation_kwargs\['repetition_penalty'\] must be a number, .*write 1.1"),
        ({"min_new_tokens": "64"}, r"generation_kwargs\['min_new_tokens'\] must be an integer, .*write 64"),
        ({"use_cache": 1}, r"generation_kwargs\['use_cache'\] must be True or False, .*got 1 \(int\)"),
        ({"early_stopping": "often"}, r"generation_kwargs\['early_stopping'\] must be True or False or 'never'"),
        ({"length_penalty": 2.0}, r"generation_kwargs\['length_penalty'\]: transformers' GenerationConfig refuses"),
        ({"cache_implementation": "nope"}, r"generation_kwargs\['cache_implementation'\]: .*refuses it"),
    ],
)
def test_generation_kwargs_of_a_wrong_value_are_refused_when_the_config_is_made(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MAGRPOConfig(generation_kwargs=kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_new_tokens": 64, "repetition_penalty": 1.1, "no_repeat_ngram_size": 3},
        {"repetition_penalty": 1},  # an integer where a float goes
        {"logits_processor": LogitsProcessorList(), "stopping_criteria": None},
        {"num_beams": 2, "early_stopping": "never", "length_penalty": 0.8},
        {"typical_p": 0.5, "min_p": 0.05, "bad_words_ids": [[1, 2], (3,)], "sequence_bias": {(5, 6): -1.0}},
        {"stop_strings": ["."], "tokenizer": char_tokenizer()},
        {key: 1 for key in SUPPORTED_SAMPLING if key not in SHADOWED},  # what the vllm backend maps
    ],
)
def test_generation_kwargs_accepted_before_still_are(tmp_path, kwargs):
    make_trainer(tmp_path, args=small_config(tmp_path, generation_kwargs=kwargs))


@pytest.mark.parametrize(
    "key,match",
    [("no_such_arg", r"; drop it"), ("num_beem", r"; did you mean 'num_beams'\?")],
)
def test_a_generation_kwarg_generate_does_not_take_is_refused_when_the_trainer_is_built(tmp_path, key, match):
    args = small_config(tmp_path, generation_kwargs={key: 2})  # the config cannot know the model's inputs
    with pytest.raises(
        ValueError, match=rf"generation_kwargs\['{key}'\] is not a generate\(\) setting: .* agent 0's model{match}"
    ):
        make_trainer(tmp_path, args=args)


# ------------------------------------------------------------------------------ text no tokenizer can encode
def test_a_formatter_writing_a_lone_surrogate_is_named_with_the_agent_and_row(tmp_path):
    def bad_for_agent_1(row):
        return row["prompt"] + (SURROGATE if row["prompt"] == "a cat" else "")

    with pytest.raises(
        ValueError, match=rf"agent 1's prompt for train_dataset row 1 \(written by formatter bad_for_agent_1\) "
        rf"{LONE_SURROGATE}"
    ):  # fmt: skip
        make_trainer(tmp_path, formatters=[lambda row: row["prompt"], bad_for_agent_1])


def test_an_eval_row_holding_a_lone_surrogate_is_named(tmp_path):
    eval_rows = [{"prompt": "fine"}, {"prompt": f"bad {SURROGATE} text"}]
    with pytest.raises(
        ValueError, match=rf"agent 0's prompt for eval_dataset row 1 \(the row's 'prompt' column\) {LONE_SURROGATE}"
    ):
        make_trainer(tmp_path, eval_dataset=eval_rows)


@pytest.mark.parametrize("passthrough", [False, True])
def test_a_transition_returning_a_lone_surrogate_is_named_with_turn_agent_and_row(tmp_path, passthrough):
    trainer = multi_turn_trainer(
        tmp_path, transition=lambda prompt: ["ok", prompt + SURROGATE], external_prompt_passthrough=passthrough
    )
    with pytest.raises(
        ValueError,
        match=rf"the prompt external_transition <lambda> returned for agent 1 after turn 1 on train_dataset row 2 "
        rf"{LONE_SURROGATE}",
    ):
        trainer.rollout(trainer.train_prompts, [2])


def test_a_lone_surrogate_in_an_evaluation_episode_names_the_eval_dataset(tmp_path):
    def transition(prompt):
        return [prompt, prompt + SURROGATE] if prompt == "judge me" else [prompt, prompt]

    trainer = multi_turn_trainer(
        tmp_path, transition=transition, trainer_kwargs={"eval_dataset": [{"prompt": "judge me"}]}
    )
    trainer.rollout(trainer.train_prompts, [0])  # training rows are fine
    with pytest.raises(ValueError, match=rf"agent 1 after turn 1 on eval_dataset row 0 {LONE_SURROGATE}"):
        trainer.evaluate()


def test_a_formatter_writing_a_lone_surrogate_on_a_later_turn_names_the_turn(tmp_path):
    def formatter(row):
        return row["prompt"] + SURROGATE if row["prompt"] == "next" else row["prompt"]

    trainer = multi_turn_trainer(tmp_path, transition=lambda prompt: ["next", "next"], formatters=formatter)
    with pytest.raises(
        ValueError, match=rf"agent 0's prompt for train_dataset row 0 at turn 2 \(written by formatter formatter\) "
        rf"{LONE_SURROGATE}"
    ):  # fmt: skip
        trainer.rollout(trainer.train_prompts, [0])


def test_a_comparator_adapter_part_holding_a_lone_surrogate_is_named():
    class Adapter:
        def parse_completion(self, completion, row, num_agents):
            return ["fine", completion + SURROGATE]

    with pytest.raises(
        ValueError,
        match=rf"agent 1's part that centralized_comparator_adapter.parse_completion returned {LONE_SURROGATE}",
    ):
        split_answer(Adapter(), "answer", DATA[0], 2)


# ------------------------------------------------------------------------------ numbers given as strings
def config_classes() -> list[type]:
    """TrainerConfig and every config class derived from it."""
    found, todo = [], [TrainerConfig]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return list(dict.fromkeys(found))


def numeric_defaults(cls: type) -> list[tuple[str, int | float]]:
    """The fields of ``cls`` whose default is an int or a float (not a bool), with it."""
    return [
        (spec.name, spec.default)
        for spec in dataclasses.fields(cls)
        if spec.init and type(spec.default) in (int, float)  # type(): a bool default is not an int here
    ]


def test_every_config_class_is_covered():
    names = {cls.__name__ for cls in config_classes()}
    expected = {"MAGRPOConfig", "MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig", "CentralizedMAGRPOConfig",
                "IACConfig", "MAACConfig", "MADPOConfig", "MADPOIterConfig", "MARLHFConfig",
                "MARLHFIterConfig"}  # fmt: skip
    assert expected <= names


@pytest.mark.parametrize(
    "cls,name,default",
    [(cls, name, default) for cls in config_classes() for name, default in numeric_defaults(cls)],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_every_numeric_field_refuses_a_number_given_as_a_string(cls, name, default):
    with pytest.raises((ValueError, TypeError), match=rf"^{name} must be .*, got the string '{default}' \(str\)"):
        cls(**{name: str(default)})


def test_a_number_given_as_a_string_says_what_to_write():
    with pytest.raises(ValueError) as error:
        MAGRPOConfig(agent_learning_rate="0.5")
    assert str(error.value) == (
        "agent_learning_rate must be a number, got the string '0.5' (str): write 0.5 (float(...) when it comes from "
        "a command line or a file)"
    )
    with pytest.raises(ValueError, match=r"^agent_learning_rate\[1\] must be a number, got the string '1e-5'"):
        MAGRPOConfig(agent_learning_rate=[1e-5, "1e-5"])
    with pytest.raises(ValueError, match=r"^reward_weights\[0\] must be a number, got the string 'one' \(str\)$"):
        MAGRPOConfig(reward_weights=["one"])
    with pytest.raises(ValueError, match=r"^learning_rate must be a number"):  # comlrl 1.4.3's name, named as given
        MAGRPOConfig(learning_rate="1e-5")
    with pytest.raises(ValueError, match=r"^weight_decay must be a finite number in \[0, 1000\].*got \[0.1\]"):
        MAGRPOConfig(weight_decay=[0.1])  # not a string, not a number: the bounds check names it, no TypeError
