"""MAGRPOConfig: defaults that make the tutorial work, and one clear error per bad field."""

from pathlib import Path

import pytest

from comlrl.rollout.decoding import decoding_settings
from comlrl.rollout.sampling import SamplingSpec
from comlrl.trainers.reinforce import MAGRPOConfig

from .helpers import assert_every_field_documented, char_tokenizer, tiny_llama


def test_every_field_is_documented():
    assert_every_field_documented(MAGRPOConfig)


def test_tutorial_fields_and_defaults():
    config = MAGRPOConfig(
        num_train_epochs=3,
        agent_learning_rate=5e-5,
        logging_steps=10,
        num_generations=8,
        num_turns=1,
        max_new_tokens=128,
    )
    assert config.num_turns == 1 and MAGRPOConfig().num_turns == 1
    assert MAGRPOConfig().advantage_normalization is True


def test_sampling_spec_forwards_generation_kwargs():
    config = MAGRPOConfig(top_k=0, generation_kwargs={"min_new_tokens": 64, "repetition_penalty": 1.1})
    kwargs = SamplingSpec.from_config(config).generate_kwargs()
    assert kwargs["top_k"] == 0 and kwargs["min_new_tokens"] == 64 and kwargs["repetition_penalty"] == 1.1
    assert kwargs["do_sample"] is True and kwargs["max_new_tokens"] == config.max_new_tokens


@pytest.mark.parametrize("model_top_k, expected", [(7, 7), (None, 50)])
def test_top_k_none_leaves_it_to_the_models_generation_config_as_143(model_top_k, expected):
    """1.4.3 did not pass top_k=None to generate, so each model's generation_config decided."""
    model = tiny_llama(char_tokenizer())
    model.generation_config.top_k = model_top_k
    kwargs = SamplingSpec.from_config(MAGRPOConfig(top_k=None)).generate_kwargs()
    assert "top_k" not in kwargs
    assert decoding_settings(model, kwargs).top_k == expected
    assert decoding_settings(model, SamplingSpec.from_config(MAGRPOConfig(top_k=0)).generate_kwargs()).top_k == 0


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("num_train_epochs", 0, "num_train_epochs must be an integer >= 1, got 0"),
        ("per_device_train_batch_size", 1.5, "per_device_train_batch_size must be an integer >= 1"),
        ("num_generations", True, "num_generations must be an integer >= 1, got True"),
        ("max_new_tokens", -3, "max_new_tokens must be an integer >= 1"),
        ("logging_steps", 0, "logging_steps must be an integer >= 1"),
        ("num_turns", 0, "num_turns must be an integer >= 1"),
        ("discount", 1.5, r"discount must be in \[0, 1\]"),
        ("discount", -0.1, r"discount must be in \[0, 1\]"),
        ("early_termination_threshold", "high", "early_termination_threshold must be a number or None"),
        ("external_prompt_passthrough", 1, "external_prompt_passthrough must be True or False"),
        ("max_generations_per_step", 0, "max_generations_per_step must be an integer >= 1"),
        ("micro_batch_size", 0, "micro_batch_size must be an integer >= 1 or None"),
        ("eval_num_samples", 2.0, "eval_num_samples must be an integer >= 1 or None"),
        ("eval_interval", -1, r"eval_interval must be an integer >= 0 \(0: only after training\)"),
        ("eval_batch_size", 0, "eval_batch_size must be an integer >= 1"),
        ("eval_do_sample", "no", "eval_do_sample must be True or False"),
        ("shuffle", "yes", "shuffle must be True or False"),
        ("seed", 1.0, "seed must be an integer"),
        ("agent_learning_rate", 0.0, r"agent_learning_rate must be a finite number in \(0, 1\]"),
        ("agent_learning_rate", float("nan"), r"agent_learning_rate must be a finite number in \(0, 1\]"),
        ("weight_decay", -0.1, r"weight_decay must be a finite number in \[0, 1000\]"),
        ("max_grad_norm", 0.0, "max_grad_norm must be > 0 or None"),
        ("temperature", 0.0, r"temperature must be > 0 \(sampling is required\)"),
        ("temperature", "hot", r"temperature must be a number, got the string 'hot' \(str\)$"),
        ("top_p", None, r"top_p must be in \(0, 1\]"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
        ("top_k", -1, "top_k must be an integer >= 0 or None"),
        ("generation_kwargs", [("min_new_tokens", 4)], "generation_kwargs must be a dict"),
        ("generation_kwargs", {"num_return_sequences": 4}, r"\['num_return_sequences'\] shadows .* num_generations"),
        ("generation_kwargs", {"temperature": 1.0}, r"\['temperature'\] shadows .* temperature on MAGRPOConfig"),
        ("generation_kwargs", {"max_new_tokens": 512}, r"\['max_new_tokens'\] shadows .* set max_new_tokens"),
        ("generation_kwargs", {"max_length": 512}, r"\['max_length'\] shadows .* set max_new_tokens"),
        ("generation_kwargs", {"do_sample": False}, r"\['do_sample'\] shadows .* set eval_do_sample"),
        ("generation_kwargs", {"input_ids": [1]}, r"may not set 'input_ids'"),
        ("disable_dropout", 1, "disable_dropout must be True or False"),
        ("joint_mode", "diagonal", r"joint_mode='diagonal'; expected one of \['aligned', 'cross'\]"),
        ("advantage_mode", "std", r"advantage_mode='std'; expected one of \['max', 'mean', 'raw', 'rloo'\]"),
        ("loss_type", "bnpo", r"loss_type='bnpo' is TRL's: write loss_type='dapo'"),
        ("loss_type", "cispo", r"loss_type='cispo' is TRL's: here the surrogate is policy_loss='cispo'"),
        ("policy_loss", "ppo", r"policy_loss='ppo'; expected one of \['cispo', 'clip', 'sapo'\]"),
        (
            "importance_sampling_level",
            "seq",
            r"importance_sampling_level='seq'; expected one of \['sequence', 'token'\]",
        ),
        ("sampler_correction", "mask", r"sampler_correction='mask'; expected one of"),
        ("top_entropy_quantile", 0, r"top_entropy_quantile must be a finite number in \(0, 1\]"),
        ("delta", 1.1, r"delta must be a finite number in \(1.2, 1000\] \(above 1 \+ epsilon_high"),
        ("mask_truncated_completions", "yes", r"mask_truncated_completions"),
        ("output_dir", "", "output_dir must be a non-empty path string"),
        ("entropy_coef", -0.1, r"entropy_coef must be a finite number in \[0, 1000\]"),
        ("generation_backend", "tgi", r"generation_backend='tgi'; expected one of \['hf', 'vllm'\]"),
        ("vllm_gpu_memory_utilization", 1.0, r"vllm_gpu_memory_utilization must be in \(0, 1\)"),
        ("compiled_decoding", "yes", "compiled_decoding must be True or False"),
    ],
)
def test_bad_field_is_named_with_what_is_allowed(field, value, match):
    with pytest.raises(ValueError, match=match):
        MAGRPOConfig(**{field: value})


def test_compiled_decoding_is_the_hf_backends():
    with pytest.raises(ValueError, match="generation_backend='vllm' runs its own engine: drop compiled_decoding"):
        MAGRPOConfig(compiled_decoding=True, generation_backend="vllm")


@pytest.mark.parametrize("mode", ["mean", "rloo", "max"])
def test_a_group_baseline_needs_two_generations(mode):
    with pytest.raises(ValueError, match=f"num_generations must be >= 2 with advantage_mode='{mode}'"):
        MAGRPOConfig(num_generations=1, advantage_mode=mode)


def test_one_generation_is_allowed_for_plain_reinforce():
    assert MAGRPOConfig(num_generations=1, advantage_mode="raw", advantage_normalization=False).num_generations == 1
    with pytest.raises(ValueError, match="advantage_normalization=True"):
        MAGRPOConfig(num_generations=1, advantage_mode="raw")


def all_config_classes():
    """Every trainer config class of the package (TrainerConfig and its subclasses, at any depth)."""
    import comlrl  # noqa: F401  (imports every trainer module)
    from comlrl.engine.config import TrainerConfig

    found, pending = [], [TrainerConfig]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda cls: cls.__name__)


@pytest.mark.parametrize("config_class", all_config_classes(), ids=lambda cls: cls.__name__)
def test_an_unknown_keyword_names_the_closest_field_and_the_docs(config_class):
    with pytest.raises(TypeError) as caught:
        config_class(early_termination_treshold=0.5, zzz=1)
    message = str(caught.value)
    assert message.startswith(f"{config_class.__name__} has no field 'early_termination_treshold' (did you mean ")
    assert "'early_termination_threshold'?), 'zzz';" in message  # nothing close: no guess
    assert f"help({config_class.__name__})" in message and "docs/reference/" in message
    page = message.rsplit("(", 1)[1].rstrip(")")
    assert (Path(__file__).resolve().parents[1] / page).is_file()


def test_a_misspelled_143_name_is_answered_with_the_name_it_became():
    with pytest.raises(TypeError, match=r"no field 'lerning_rate' \(did you mean 'agent_learning_rate'\?\)"):
        MAGRPOConfig(lerning_rate=1e-5)
    with pytest.raises(TypeError, match=r"no field 'generations' \(did you mean 'num_generations'\?\)"):
        MAGRPOConfig(generations=4)
