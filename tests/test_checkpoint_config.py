"""The config a checkpoint stores: JSON whatever the config holds, and a resume that says which
values it could not store and must be passed again."""

import json
import math
from fractions import Fraction

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from comlrl.checkpoint import check_resumed_config, config_record, not_json_values
from comlrl.trainers.reinforce import MAGRPOConfig

LIST_TYPE = "transformers.generation.logits_process.LogitsProcessorList"


class BanToken(LogitsProcessor):
    """A user's own logits processor: an object JSON cannot hold."""

    def __init__(self, token_id: int):
        self.token_id = token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores[:, self.token_id] = -math.inf
        return scores

    def __repr__(self) -> str:
        return f"BanToken({self.token_id})"


BAN_TYPE = f"{__name__}.BanToken"


def processor_config(**generation_kwargs) -> MAGRPOConfig:
    return MAGRPOConfig(generation_kwargs={"logits_processor": LogitsProcessorList([BanToken(3)]), **generation_kwargs})


def test_record_of_a_logits_processor_is_json_and_names_its_type():
    config = processor_config(repetition_penalty=1.1)
    record = config_record(config)
    text = json.dumps(record, allow_nan=True)
    marker = json.loads(text)["generation_kwargs"]["logits_processor"]["__not_json__"]
    assert marker["type"] == LIST_TYPE
    assert "BanToken(3)" in marker["repr"]
    assert record["generation_kwargs"]["repetition_penalty"] == 1.1
    assert record["num_generations"] == config.num_generations
    assert config.generation_kwargs["logits_processor"][0].token_id == 3  # the config itself is untouched


def test_a_bare_processor_object_is_a_marker_and_long_reprs_are_cut():
    config = MAGRPOConfig(generation_kwargs={"logits_processor": BanToken(7), "note": object()})
    record = config_record(config)
    json.dumps(record, allow_nan=True)
    assert record["generation_kwargs"]["logits_processor"] == {
        "__not_json__": {"type": BAN_TYPE, "repr": "BanToken(7)"}
    }
    config.generation_kwargs["logits_processor"] = LogitsProcessorList([BanToken(i) for i in range(100)])
    assert len(config_record(config)["generation_kwargs"]["logits_processor"]["__not_json__"]["repr"]) <= 200


def test_nested_containers_and_non_finite_floats_are_kept():
    config = MAGRPOConfig(
        generation_kwargs={"bad_words_ids": [[1, 2], (3,)], "extra": {"a": (1.5, None, True), "b": {"c": "x"}}},
    )
    config.generation_kwargs["limits"] = [math.nan, math.inf, -math.inf]
    record = config_record(config)
    assert record["generation_kwargs"]["bad_words_ids"] == [[1, 2], [3]]
    assert record["generation_kwargs"]["extra"] == {"a": [1.5, None, True], "b": {"c": "x"}}
    nan, inf, minus_inf = record["generation_kwargs"]["limits"]
    assert math.isnan(nan) and inf == math.inf and minus_inf == -math.inf
    assert not_json_values(record) == {}
    json.dumps(record, allow_nan=True)


def test_a_dict_with_other_keys_than_str_is_a_marker_as_a_whole():
    config = MAGRPOConfig(generation_kwargs={"sequence_bias": {(5, 6): -1.0, "ok": 1.0}})
    record = config_record(config)
    assert record["generation_kwargs"]["sequence_bias"]["__not_json__"]["type"] == "builtins.dict"
    json.dumps(record, allow_nan=True)


def test_not_json_values_gives_python_paths():
    config = processor_config(extra=[1, {"inner": BanToken(1)}])
    config.reward_weights = [1.0, Fraction(1, 2)]
    record = config_record(config)
    assert not_json_values(record) == {
        "generation_kwargs['logits_processor']": LIST_TYPE,
        "generation_kwargs['extra'][1]['inner']": BAN_TYPE,
        "reward_weights[1]": "fractions.Fraction",
    }


def test_resume_without_the_value_names_it_and_what_to_pass():
    record = config_record(processor_config())
    for missing in (MAGRPOConfig(), MAGRPOConfig(generation_kwargs={"logits_processor": None})):
        with pytest.raises(ValueError) as caught:
            check_resumed_config("out/checkpoint-4", record, missing)
        message = str(caught.value)
        assert "out/checkpoint-4" in message and "generation_kwargs['logits_processor']" in message
        assert LIST_TYPE in message
        assert "MAGRPOConfig(generation_kwargs={'logits_processor': <a LogitsProcessorList>})" in message


def test_resume_with_another_type_is_refused():
    record = config_record(processor_config())
    other = MAGRPOConfig(generation_kwargs={"logits_processor": BanToken(3)})
    with pytest.raises(ValueError, match=rf"generation_kwargs\['logits_processor'\].*holds a {BAN_TYPE}"):
        check_resumed_config("out/checkpoint-4", record, other)


def test_resume_with_the_same_type_returns_a_note():
    record = config_record(processor_config())
    notes = check_resumed_config("out/checkpoint-4", record, processor_config())
    assert notes == [
        f"generation_kwargs['logits_processor'] (a {LIST_TYPE}) was not stored in checkpoint out/checkpoint-4; "
        "using this run's"
    ]


def test_an_old_record_without_markers_passes():
    old = {"num_generations": 4, "generation_kwargs": {"repetition_penalty": 1.1}, "reward_weights": None}
    assert check_resumed_config("out/checkpoint-2", old, MAGRPOConfig()) == []
    assert not_json_values(old) == {}
