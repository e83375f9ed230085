"""A broken model folder is one error before (or, for sizes, while) it loads: naming the
argument it came from, the file, what is wrong and what to do, with the library's own error
as its cause. Without the checks each fault surfaced deep in transformers or safetensors."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from comlrl.models.folders import check_model_source
from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers import MARLHFConfig, MARLHFTrainer
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOTrainer

from .helpers import DATA, char_tokenizer, content_score, small_config, tiny_llama


def edit_config(folder, **changes):
    path = Path(folder, "config.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def truncate(path, by=100):
    os.truncate(path, os.path.getsize(path) - by)


def cut_weights(folder):
    truncate(Path(folder, "model.safetensors"))
    return "model.safetensors", r"holds [\d,]+ bytes of the [\d,]+ its header declares.*cut short", SafetensorError


def unknown_architecture(folder):
    edit_config(folder, model_type="no_such_arch")
    return "config.json", r"names model_type 'no_such_arch', which transformers [\d.]+ does not know", None


def wider_hidden_size(folder):
    edit_config(folder, hidden_size=64)
    return "config.json", r"\(hidden_size, vocab_size, \.\.\.\) do not fit the tensors of its weights", RuntimeError


def other_vocab_size(folder):
    edit_config(folder, vocab_size=99)
    return "config.json", r"do not fit the tensors of its weights; put back the config.json", RuntimeError


def invalid_json(folder):
    Path(folder, "config.json").write_text('{"model_type": "llama",')
    return "config.json", r"is not valid JSON \(.*\); put back the file saved with the model", json.JSONDecodeError


def no_weights(folder):
    os.remove(Path(folder, "model.safetensors"))
    return "", r"holds config.json but no weights \(model.safetensors, .*save_pretrained", None


FAULTS = [cut_weights, unknown_architecture, wider_hidden_size, other_vocab_size, invalid_json, no_weights]


@pytest.fixture
def broken(model_folder, tmp_path):
    """``break_it(fault) -> (folder, file, message pattern, cause type)``: a copy of the model
    folder broken by ``fault``; the healthy one stays at ``model_folder``."""

    def break_it(fault):
        folder = str(tmp_path / f"broken-{fault.__name__}")
        shutil.copytree(model_folder, folder)
        name, pattern, cause = fault(folder)
        return folder, os.path.join(folder, name).rstrip(os.sep), pattern, cause

    return break_it


def assert_one_error(call, argument, folder, file, pattern, cause):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{argument} {folder!r}: "), message
    assert file in message, message
    assert re.search(pattern, message), message
    if cause is None:
        assert info.value.__cause__ is None
    else:
        assert isinstance(info.value.__cause__, cause), repr(info.value.__cause__)


def by_agent_model(tmp_path, good, bad):
    MAGRPOTrainer(
        agent_model=bad, num_agents=2, train_dataset=DATA, reward_func=content_score, args=small_config(tmp_path)
    )


def by_agents(tmp_path, good, bad):
    MAGRPOTrainer(agents=[good, bad], train_dataset=DATA, reward_func=content_score, args=small_config(tmp_path))


def iac(tmp_path, **critic):
    tok = char_tokenizer()
    IACTrainer(
        agents=[tiny_llama(tok, i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=content_score,
        args=IACConfig(num_train_epochs=1, num_generations=1, max_new_tokens=6, output_dir=str(tmp_path / "run")),
        **critic,
    )


def by_critic_model(tmp_path, good, bad):
    iac(tmp_path, critic_model=bad)


def by_critics(tmp_path, good, bad):
    iac(tmp_path, critics=[good, bad])


def by_reward_model(tmp_path, good, bad):
    JointRewardModel.from_pretrained(bad)


ROUTES = {
    "agent_model": by_agent_model,
    "agents[1]": by_agents,
    "critic_model": by_critic_model,
    "critics[1]": by_critics,
    "reward_model_name": by_reward_model,
}


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.__name__)
def test_each_fault_is_one_error_naming_agent_model_and_the_file(tmp_path, model_folder, broken, fault):
    folder, file, pattern, cause = broken(fault)
    assert_one_error(
        lambda: by_agent_model(tmp_path, model_folder, folder), "agent_model", folder, file, pattern, cause
    )


@pytest.mark.parametrize("argument", [a for a in ROUTES if a != "agent_model"])
@pytest.mark.parametrize("fault", [cut_weights, wider_hidden_size], ids=lambda fault: fault.__name__)
def test_every_argument_that_loads_a_model_is_named(tmp_path, model_folder, broken, argument, fault):
    # one fault the folder check finds, one only loading finds
    folder, file, pattern, cause = broken(fault)
    route = ROUTES[argument]
    assert_one_error(lambda: route(tmp_path, model_folder, folder), argument, folder, file, pattern, cause)


def marlhf(tmp_path, model_folder, **fields):
    args = MARLHFConfig(num_generations=1, output_dir=str(tmp_path / "run"), **fields)
    MARLHFTrainer(agent_model=model_folder, train_dataset=DATA, reward_func=content_score, args=args)


@pytest.mark.parametrize("field", ["reward_model_name", "critic_model_name"])
def test_marlhfs_model_names_are_checked_when_the_trainer_is_built(tmp_path, model_folder, broken, field):
    # the reward model loads only once the pairs are made: its folder is checked long before
    folder, file, pattern, cause = broken(unknown_architecture)
    fields = {"reward_model_name": model_folder, "rl_algorithm": "iac", field: folder}
    assert_one_error(lambda: marlhf(tmp_path, model_folder, **fields), field, folder, file, pattern, cause)


@pytest.fixture
def sharded(tmp_path):
    """A tiny model saved in several safetensors shards, with their index."""
    folder = tmp_path / "sharded"
    tiny_llama(char_tokenizer()).save_pretrained(folder, max_shard_size="30KB")
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    return str(folder), shards


def test_a_shard_missing_from_the_index_is_named(sharded):
    folder, shards = sharded
    check_model_source(folder, "agent_model")  # whole, it passes
    os.remove(os.path.join(folder, shards[-1]))
    index = os.path.join(folder, "model.safetensors.index.json")
    with pytest.raises(ValueError, match=rf"^agents\[0\] '.*': {index} lists 1 shard\(s\) missing from the folder "):
        check_model_source(folder, "agents[0]")
    with pytest.raises(ValueError, match=shards[-1]):
        check_model_source(folder, "agents[0]")


def test_a_cut_shard_is_named(sharded):
    folder, shards = sharded
    truncate(os.path.join(folder, shards[0]))
    with pytest.raises(ValueError, match=rf"{shards[0]} holds [\d,]+ bytes of the [\d,]+ its header declares"):
        check_model_source(folder, "critics[0]")


def test_a_cut_header_has_no_declared_size_but_is_named(model_folder):
    weights = os.path.join(model_folder, "model.safetensors")
    truncate(weights, os.path.getsize(weights) - 20)  # 20 bytes left: inside the header
    with pytest.raises(ValueError, match=r"model.safetensors holds 20 bytes, so it is not a complete safetensors file"):
        check_model_source(model_folder, "agent_model")


def test_pytorch_bin_weights_only_need_to_be_there(tmp_path):
    tok = char_tokenizer()
    model = tiny_llama(tok)
    folder = tmp_path / "bin"
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    agents = MAGRPOTrainer(
        agent_model=str(folder),
        num_agents=1,
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=content_score,
        args=small_config(tmp_path),
    ).agents
    torch.testing.assert_close(agents[0].lm_head.weight, model.lm_head.weight)


def test_a_config_without_model_type_is_named(model_folder):
    config = json.loads(Path(model_folder, "config.json").read_text())
    del config["model_type"]
    Path(model_folder, "config.json").write_text(json.dumps(config))
    path = os.path.join(model_folder, "config.json")
    with pytest.raises(ValueError, match=rf"^agent_model '.*': {path} names no model_type, which transformers"):
        check_model_source(model_folder, "agent_model")
