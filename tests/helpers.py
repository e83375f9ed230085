"""Shared test helpers (no tests, no fixtures): tiny offline tokenizers and models, the
examples loader, a small MAGRPO trainer with its data, config and rewards, weight
snapshots, the multi-turn transition and trainer, checkpoint and config-doc helpers, a LoRA
config, and the data-parallel worker that tests/ddp_worker.py runs under torchrun. Test
modules import from here, never from each other or from conftest.py."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import json
import os
import signal
import string
import types
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, decoders, models, processors
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from comlrl.checkpoint import complete_checkpoints
from comlrl.engine.centralized import CentralizedComparatorParseError
from comlrl.engine.sharding import local
from comlrl.environments import Environment, Outcome, Start, ToolCall
from comlrl.rollout.generation import build_rollout, encode_prompts
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.dpo import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer, reward_histograms
from comlrl.trainers.dpo.objective import PAIRS_FILE
from comlrl.trainers.dpo.pairs import PreferencePair
from comlrl.trainers.dpo.rounds import PreferenceRounds, pair_record
from comlrl.trainers.reinforce import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
)
from comlrl.trainers.rlhf import MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer
from comlrl.trainers.rlhf.reward_model import FittedRewardModel, seeded

# ------------------------------------------------------------------------------ tiny tokenizers and models
LOWER = "abcdefghijklmnopqrstuvwxyz .,:!?"
MIXED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,:;!?'-"


def char_tokenizer(alphabet: str = LOWER, pad: bool = True) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``alphabet``, plus specials."""
    specials = ["<unk>", "<eos>"] + (["<pad>"] if pad else [])
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(alphabet)))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<pad>" if pad else None,
    )


CHAT_ALPHABET = string.ascii_letters + string.digits + " .,:;!?[]<>|/_{}\"'-=+\n()"


IGNORES_TOOLS = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A chat template like SmolLM2's ChatML: the end of a message is the EOS token, and ``tools=`` is ignored."""


def chat_tokenizer(template: str, adds_bos: bool = False) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with a chat template (enough characters for JSON tool
    calls and ``name(argument)`` ones); with ``adds_bos`` it puts ``<s>`` before every text it
    encodes (as Llama's do)."""
    specials = ["<unk>", "<eos>", "<pad>", "<s>"]
    vocab = {token: i for i, token in enumerate(specials + list(dict.fromkeys(CHAT_ALPHABET)))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>", bos_token="<s>"
    )
    tokenizer.chat_template = template
    return tokenizer


def tiny_llama(tokenizer, seed: int = 0, attention_dropout: float = 0.0) -> LlamaForCausalLM:
    """A tiny Llama (rotary positions, untied embeddings; Llama checkpoints' attention dropout is 0)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        attention_dropout=attention_dropout,
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def tiny_gpt2(tokenizer, seed: int = 0, dropout: float = 0.1) -> GPT2LMHeadModel:
    """A tiny GPT-2 with what real ones have: absolute positions, tied embeddings and
    GPT-2's own dropout of 0.1 (built from a config, it is in train mode)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=256,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return GPT2LMHeadModel(config)


def with_lora(build):
    """``build``'s model under a LoRA adapter that changes its outputs (B not zero). The
    wrapper's forward names few arguments and passes the others on to the base model."""

    def wrapped(tok):
        model = build(tok)
        targets = ["c_attn"] if hasattr(model, "transformer") else ["q_proj", "v_proj"]
        return get_peft_model(model, LoraConfig(r=4, target_modules=targets, init_lora_weights=False))

    return wrapped


def position_sensitive(build, tok):
    """A tiny model whose next token depends strongly on positions, so that decoding with
    shifted positions (padding counted) changes the greedy tokens."""
    model = build(tok).eval()
    with torch.no_grad():
        if hasattr(model, "transformer"):  # GPT-2: learned absolute positions
            model.transformer.wpe.weight.mul_(30)
        else:  # Llama: rotary positions act through sharper attention
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(8)
                layer.self_attn.k_proj.weight.mul_(8)
    return model


def left_padded(tok, prompts):
    """``(ids, attention_mask)`` of ``prompts``, left-padded to the longest (as sampling pads them)."""
    encoded = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    return encoded["input_ids"], encoded["attention_mask"]


def lora():
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")


TUTORIAL_FLAGS = ["--wandb", "--wandb-project", "--wandb-entity", "--model", "--output-dir", "--epochs",
                  "--num-generations", "--max-new-tokens", "--seed"]  # fmt: skip
"""The tutorial example's flags, which every example that follows it keeps."""


def help_text(example: types.ModuleType, capsys) -> str:
    """What an example's ``--help`` prints (argparse exits after printing it)."""
    with pytest.raises(SystemExit):
        example.parse_args(["--help"])
    return capsys.readouterr().out


def load_example(filename: str) -> types.ModuleType:
    """A script of ``examples/`` (their names have dashes) imported as a module."""
    path = Path(__file__).resolve().parents[1] / "examples" / filename
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ a small MAGRPO trainer
DATA = [{"prompt": "hello there:"}, {"prompt": "a cat"}, {"prompt": "tell me, why?"}]


def small_config(tmp_path, **overrides):
    values = dict(
        num_train_epochs=1,
        num_generations=2,
        max_new_tokens=6,
        logging_steps=1,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return MAGRPOConfig(**values)


def length_sum(*completions):
    return [float(sum(len(c) for c in joint)) for joint in zip(*completions)]


def content_score(*completions):
    """Depends on every agent's text, so each agent's samples get different credit."""
    return [float(sum(ord(ch) for c in joint for ch in c) % 13) for joint in zip(*completions)]


def make_trainer(tmp_path, agents=None, tokenizer=None, **kwargs):
    tok = tokenizer or char_tokenizer()
    if agents is None:
        agents = [tiny_llama(tok, seed=i) for i in range(2)]
    kwargs.setdefault("train_dataset", DATA)
    kwargs.setdefault("reward_func", length_sum)
    kwargs.setdefault("args", small_config(tmp_path))
    return MAGRPOTrainer(agents=agents, tokenizer=tok, **kwargs)


def snapshot(agents):
    return [[p.detach().clone() for p in a.parameters()] for a in agents]


def unchanged(before, agents):
    return all(torch.equal(b, p) for bs, a in zip(before, agents) for b, p in zip(bs, a.parameters()))


def weights(trainer) -> list[torch.Tensor]:
    """Each agent's parameters (then each critic's value head's, if the trainer has critics) as one flat tensor."""
    modules = list(trainer.agents) + [critic.head for critic in getattr(trainer, "critics", [])]
    return [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in modules]


# ------------------------------------------------------------------------------ multi-turn
def revise(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """The original library's transition signature: every agent sees the others' last texts."""
    return [
        f"{prompt} | others: {' / '.join(agent_completions[:i] + agent_completions[i + 1 :])}"
        for i in range(num_agents)
    ]


def multi_turn_trainer(
    tmp_path, num_agents=2, transition=revise, reward=length_sum, formatters=None, trainer_kwargs=None, **overrides
):
    tok = char_tokenizer()
    values = dict(num_turns=2, num_generations=2, max_new_tokens=3)
    values.update(overrides)
    return make_trainer(
        tmp_path,
        agents=[tiny_llama(tok, seed=i) for i in range(num_agents)],
        tokenizer=tok,
        reward_func=reward,
        formatters=formatters,
        external_transition=transition,
        args=small_config(tmp_path, **values),
        **(trainer_kwargs or {}),
    )


def scripted_generate(prompts, letter_at=-1):
    """A tree's ``generate`` without a model: G = 2 completions of each prompt, written from
    it (its letter at ``letter_at``, the agent's letter, then "z" for the second sample)."""
    tok = char_tokenizer()
    rollouts = []
    for i, agent_prompts in enumerate(prompts):
        texts = [p[letter_at] + "ab"[i] + "z" * k for p in agent_prompts for k in range(2)]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        rollouts.append(build_rollout(tok, encode_prompts(tok, agent_prompts), ids, 2, [], 0, torch.device("cpu")))
    return rollouts


# ------------------------------------------------------------------------------ checkpoints and logs
def interrupting_reward(at_call, score=length_sum):
    """``score`` that sends this process SIGINT during its ``at_call``-th call (that step still finishes)."""
    calls = []

    def reward(a, b):
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return score(a, b)

    reward.__name__ = score.__name__  # logged under the same name as the straight run's reward
    return reward


def assert_same_run(resumed, straight, resumed_dir, straight_dir):
    """A resumed trainer ends with the straight one's weights, and its run folder logged the same steps."""
    for a, b in zip(weights(resumed), weights(straight)):
        assert torch.equal(a, b)
    assert log_lines(resumed_dir / "run", "metrics.jsonl") == log_lines(straight_dir / "run", "metrics.jsonl")


def log_lines(run_dir, name):
    """The JSONL log without the timings, which differ between runs."""
    lines = [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
    return [{k: v for k, v in line.items() if not k.startswith("time/")} for line in lines]


# ------------------------------------------------------------------------------ configs
def assert_every_field_documented(config_class):
    """Each field, in whichever class of the hierarchy declares it, has a docstring line."""
    sources = [inspect.getsource(c) for c in config_class.__mro__ if dataclasses.is_dataclass(c)]
    for field in dataclasses.fields(config_class):
        source = next(s for s in sources if f"    {field.name}: " in s)
        declaration = source.index(f"    {field.name}: ")
        following = source[declaration:].split("\n", 2)[1].strip()
        assert following.startswith('"""'), f"{config_class.__name__}.{field.name} has no docstring line"


# ------------------------------------------------------------------------------ data parallelism (torchrun)
ROWS = [{"prompt": text} for text in ["a cat", "hello", "why?", "go on", "the sea", "rain", "a b c", "yes"]]


def score(prompts, a, b):
    """Differs between rows (through the prompt), so advantages have a spread to whiten."""
    return [float(len(p) + x.count("a") - y.count("e")) for p, x, y in zip(prompts, a, b)]


def distinct_score(prompts, a, b):
    """Different joint texts score differently (a hash of both), so MADPO's candidates never tie."""
    return [float(sum(ord(ch) * 31**k for k, ch in enumerate(f"{x}|{y}")) % 100003) for x, y in zip(a, b)]


def ranged_distinct_score(prompts, a, b):
    """:func:`distinct_score`, declaring its range: the iterative trainers' reward histograms need one."""
    return distinct_score(prompts, a, b)


ranged_distinct_score.reward_range = (0.0, 100003.0)


def rank_flat_score(prompts, a, b):
    """On rank 0 the odd-length prompts give every sample 1 (flat groups: dynamic sampling
    refills them); everything else scores :func:`distinct_score` (groups never flat)."""
    rank = int(os.environ.get("RANK", "0"))
    return [1.0 if rank == 0 and len(p) % 2 else s for p, s in zip(prompts, distinct_score(prompts, a, b))]


class RecordedRefill:
    """A dynamic sampler that appends each step's rounds and this rank's refill to a JSONL file."""

    def __init__(self, refill, path: Path):
        self.refill, self.path = refill, path

    def __call__(self, tree, step):
        tree, metrics = self.refill(tree, step)
        record = {"step": step, **{key.split("/")[1]: stat.value() for key, stat in metrics.items()}}
        with self.path.open("a") as file:
            file.write(json.dumps(record) + "\n")
        return tree, metrics


MADPO_ROWS = ROWS[:7]
"""3 candidates per row that never tie give each row its 3 pairs: 21, so with 2 ranks x 2
pairs per step the last step of an epoch holds 1 pair and leaves rank 1 without one."""


def marlhf_pairs() -> list[PreferencePair]:
    """Pairs of ROWS' prompts that a reward model can learn (a "yes" and "good" beat a "no"
    and "bad"): rows 0, 2, 4 and 6 have two each, so the prompts that reward_eval_fraction=0.25
    holds out at the default seed (rows 3 and 6) hold 3 pairs, and the 9 left make batches of
    4, 4 and 1 pairs."""
    pairs = []
    for row, prompt in enumerate(record["prompt"] for record in ROWS):
        texts = [([f"{prompt} yes", "good good"], [f"{prompt} no", "bad"])]
        texts += [([f"yes {prompt}", "good"], [f"no {prompt}", "bad bad"])] if row % 2 == 0 else []
        pairs += [text_pair(row, prompt, chosen, rejected) for chosen, rejected in texts]
    return pairs


def text_pair(row: int, prompt: str, chosen: list[str], rejected: list[str]) -> PreferencePair:
    """A pair of two agents' texts (no token ids: enough for a reward model), ``chosen`` scored 1."""
    return PreferencePair(
        row=row,
        prompts=[prompt, prompt],
        prompt_ids=[],
        chosen_ids=[],
        rejected_ids=[],
        chosen_texts=chosen,
        rejected_texts=rejected,
        chosen_reward=1.0,
        rejected_reward=0.0,
    )


class GivenPairsStage(FittedRewardModel):
    """MARLHF's reward model fitted to :func:`marlhf_pairs`, the same in every process:
    greedy sampling, which makes the RL phase's rollouts equal whatever the ranks, would make
    every candidate of a prompt alike, and so no pair."""

    def fit(self) -> dict[str, float]:
        seed = self.args.seed
        return self.fit_pairs(marlhf_pairs(), seeded(seed), seeded(seed + 1))


class MARLHFOnGivenPairs(MARLHFTrainer):
    """MARLHF whose reward model is fitted to :func:`marlhf_pairs`."""

    reward_source_class = GivenPairsStage


def reward_backbone(folder: Path, seed: int) -> str:
    """A tiny Llama written to ``folder`` for a reward model to load."""
    tok = char_tokenizer()
    tiny_llama(tok, seed=seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def build_trainer(algorithm: str, output_dir: Path, per_device_rows: int, sharding: str = "replicate"):
    """top_k=1 samples deterministically, so any split of the rows over ranks samples the
    same completions as one process would. MADPO's candidates are sampled at random (a pair
    needs two that differ), so each rank's differ from one process's: its single process
    trains on the pairs the ranks built (``run_ddp_worker``'s ``pairs_from``). MARLHF fits its
    reward model to given pairs (:class:`GivenPairsStage`) and trains with MAREINFORCE (as the
    "magrpo" case: greedy samples of a prompt are alike, so MAGRPO's mean baseline would leave
    no advantage). Each rank starts from its own random weights (seeded by ``RANK``), the
    reward model's transformer too: the trainer must broadcast rank 0's.

    The iterative trainers ("madpo_iter", "marlhf_iter") run 2 rounds of one epoch each, and
    sample at random (pairs need candidates that differ): MADPOIter with the ``history``
    comparator (its snapshot goes into the checkpoint), DPO's reference margins and the
    reward histograms; MARLHFIter with MAREINFORCE on each round's reward model."""
    tok = chat_tokenizer(IGNORES_TOOLS) if algorithm == "environment_tools" else char_tokenizer()
    rank = int(os.environ.get("RANK", "0"))
    agents = [tiny_llama(tok, seed=i + 10 * rank) for i in range(2)]
    precision = "bf16" if algorithm.endswith("_bf16") else "fp32"  # "magrpo_bf16": MAREINFORCE in bf16
    algorithm = algorithm.removesuffix("_bf16")
    shared = dict(
        num_train_epochs=2,
        per_device_train_batch_size=per_device_rows,
        max_new_tokens=6,
        logging_steps=1,
        save_steps=2,
        agent_learning_rate=1e-3,
        micro_batch_size=3,
        output_dir=str(output_dir),
        sharding=sharding,
        precision=precision,
    )
    rounds = dict(num_iterations=2, preference_num_candidates=2, preference_pairs_per_sample=2)
    if algorithm == "madpo_iter":
        args = MADPOIterConfig(
            comparator_policy="history",
            dpo_reference="initial",
            log_reward_distribution=True,
            **rounds,
            **{**shared, "num_train_epochs": 1},
        )
        return MADPOIterTrainer(
            agents=agents, tokenizer=tok, train_dataset=MADPO_ROWS, reward_func=ranged_distinct_score, args=args
        )
    if algorithm == "marlhf_iter":
        args = MARLHFIterConfig(
            rl_algorithm="mareinforce",
            reward_model_name=ranks_reward_backbone(output_dir, rank),
            reward_learning_rate=1e-3,
            reward_train_batch_size=4,
            num_generations=2,
            **rounds,
            **{**shared, "num_train_epochs": 1},
        )
        return MARLHFIterTrainer(
            agents=agents, tokenizer=tok, train_dataset=ROWS, reward_func=distinct_score, args=args
        )
    if algorithm == "madpo":
        # train_batch_size counts pairs per rank and step; rows are sampled 4 at a time either way.
        pairs_per_step = {"per_device_train_batch_size": 4, "train_batch_size": per_device_rows}
        args = MADPOConfig(
            preference_num_candidates=3,
            preference_pairs_per_sample=3,
            dpo_reference="initial",
            **{**shared, **pairs_per_step},
        )
        return MADPOTrainer(
            agents=agents, tokenizer=tok, train_dataset=MADPO_ROWS, reward_func=distinct_score, args=args
        )
    if algorithm == "dynamic":  # sampled at random: greedy samples would leave every group flat
        args = MAGRPOConfig(dynamic_sampling=True, num_generations=2, max_resample_rounds=2, **shared)
        trainer = MAGRPOTrainer(
            agents=agents, tokenizer=tok, train_dataset=ROWS, reward_func=rank_flat_score, args=args
        )
        trainer.objective.refill = RecordedRefill(
            trainer.objective.refill, output_dir.parent / f"refill_rank{rank}.jsonl"
        )
        return trainer
    common = dict(num_generations=2, top_k=1, **shared)
    if algorithm == "marlhf":
        backbone = ranks_reward_backbone(output_dir, rank)
        # One text per forward of the reward model: alike completions then score exactly alike,
        # as zero_std_group_frac counts (rows of one batch may round differently).
        args = MARLHFConfig(
            rl_algorithm="mareinforce",
            reward_model_name=backbone,
            reward_learning_rate=1e-3,
            reward_num_train_epochs=2,
            reward_train_batch_size=4,
            reward_eval_fraction=0.25,
            **{**common, "micro_batch_size": 1},
        )
        return MARLHFOnGivenPairs(agents=agents, tokenizer=tok, train_dataset=ROWS, reward_func=score, args=args)
    if algorithm == "environment":  # MAREINFORCE in an environment of two turns
        args = MAREINFORCEConfig(num_turns=2, **common)
        return MAREINFORCETrainer(agents=agents, tokenizer=tok, train_dataset=ROWS, environment=Exchange(), args=args)
    if algorithm == "environment_tools":  # MAREINFORCE where every message calls a tool
        args = MAREINFORCEConfig(**common)
        return MAREINFORCETrainer(
            agents=agents, tokenizer=tok, train_dataset=ROWS, environment=CountingTools(), args=args
        )
    if algorithm == "centralized":  # one model writes both roles, with MAREINFORCE's raw returns
        args = CentralizedMAGRPOConfig(num_agents=2, advantage_mode="raw", advantage_normalization=False, **common)
        return CentralizedMAGRPOTrainer(
            agents=agents[:1],
            tokenizer=tok,
            train_dataset=ROWS,
            reward_func=score,
            args=args,
            centralized_adapter=SplitInHalves(),
        )
    if algorithm == "iac":
        trainer_class, args = IACTrainer, IACConfig(critic_learning_rate=1e-3, **common)
    elif algorithm == "maac":  # a separate critic model: replicated while the agents may be sharded
        critic_tok = char_tokenizer(MIXED + "[]|\n")  # reads the joint inputs "[Agent 0] ..."
        critic = dict(critics=[tiny_llama(critic_tok, seed=20 + 10 * rank)], critic_tokenizer=critic_tok)
        args = MAACConfig(critic_learning_rate=1e-3, **common)
        return MAACTrainer(agents=agents, tokenizer=tok, train_dataset=ROWS, reward_func=score, args=args, **critic)
    elif algorithm in ("lora", "shared_lora"):  # MAREINFORCE on LoRA adapters, one base each or one shared
        lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        base = agents if algorithm == "lora" else [agents[0]] * 2
        args = MAREINFORCEConfig(**{**common, "agent_learning_rate": 1e-2})
        return MAREINFORCETrainer(
            agents=base, tokenizer=tok, train_dataset=ROWS, reward_func=score, args=args, peft_config=lora
        )
    else:
        trainer_class, args = MAREINFORCETrainer, MAREINFORCEConfig(**common)
    return trainer_class(agents=agents, tokenizer=tok, train_dataset=ROWS, reward_func=score, args=args)


class Exchange(Environment):
    """Two agents answer a prompt, then each sees the other's answer; each turn pays
    :func:`score` per agent (turn 2 ends the episode)."""

    def reset(self, row):
        return Start([row["prompt"], row["prompt"] + "?"], state=row["prompt"])

    def step(self, state, actions, turn):
        a, b = actions
        rewards = [score([state], [a], [b])[0], score([state], [b], [a])[0]]
        if turn == 2:
            return Outcome(rewards)
        return Outcome(rewards, observations=[f"{state} {b}", f"{state} {a}"], state=state)


def count(text: str) -> str:
    """How many characters a text has.

    Args:
        text: the text.
    """
    return str(len(text))


class CountingTools(Environment):
    """Each agent answers a word with one tool, :func:`count`, which every message it writes
    calls (on its first three characters); its action is what it writes after the result, and
    its reward 1 + that action's length modulo 3 (never 0: MAREINFORCE's raw returns move every agent)."""

    reward_name = "counting"
    max_tool_calls = 1
    tool_instructions = "Call count."  # short: character-level prompts stay within the tiny models' positions

    def reset(self, row):
        prompt = [{"role": "user", "content": row["prompt"]}]
        return Start([prompt, prompt], state=row["prompt"])

    def tools(self, agent, state):
        return [count]

    def tool_calls(self, agent, text):
        return [ToolCall("count", {"text": text[:3]})]

    def step(self, state, actions, turn):
        return Outcome([1.0 + len(action) % 3 for action in actions])


class SplitInHalves:
    """A centralized adapter: the agents' prompts joined; a response's first half is role 0's
    answer, the rest role 1's (never unsplittable)."""

    def build_prompt(self, row, agent_prompts):
        return " | ".join(agent_prompts)

    def parse_completion(self, completion, row, num_agents):
        middle = len(completion) // 2
        return [completion[:middle], completion[middle:]]


def ranks_reward_backbone(output_dir: Path, rank: int) -> str:
    """Rank ``rank``'s reward-model backbone, beside ``output_dir``: each rank's has other weights."""
    return reward_backbone(output_dir.parent / f"reward_backbone_rank{rank}", seed=5 + 10 * rank)


def checkpoint_pairs(checkpoint: Path) -> list[PreferencePair]:
    """The preference pairs a MADPO checkpoint holds."""
    return [PreferencePair(**record) for record in torch.load(checkpoint / PAIRS_FILE)]


def reward_model_weights(trainer) -> list[torch.Tensor]:
    """A MARLHF trainer's reward model: its head's weight and bias and its token embeddings."""
    model = trainer.reward_model
    return [model.head.weight, model.head.bias, model.backbone.get_input_embeddings().weight]


def run_ddp_worker(
    algorithm: str, out: str, per_device_rows: int, pairs_from: str | None = None, sharding: str = "replicate"
) -> None:
    """One rank's run for tests/test_distributed.py: trains the tiny agents on its share of
    each step's rows (MADPO: pairs), resumes from the mid-run checkpoint, and saves what it
    holds (weights, MADPO's pairs as records and MARLHF's reward model, to ``rank{rank}.pt``;
    world size, saved folders and steps to ``rank{rank}.json``). MADPO trains on the pairs of
    the checkpoint ``pairs_from`` when given, else on those it builds. The iterative trainers
    also save every round's pairs (their shards) and count the round files (preference_replay
    shards, reward histograms) this rank wrote in both runs."""
    out_dir = Path(out)
    with counted_round_files() as round_files:
        straight = build_trainer(algorithm, out_dir / "run", per_device_rows, sharding)
        if pairs_from is not None:
            straight.objective.pairs = checkpoint_pairs(Path(pairs_from))
        straight.train()
        rank = straight.parallel.rank
        saved = straight.save_model(str(out_dir / "saved"))
        if algorithm in ("lora", "shared_lora"):
            straight.save_model(str(out_dir / "merged"), merge_adapters=True)
        resumed = build_trainer(algorithm, out_dir / "run", per_device_rows, sharding)
        resumed.train(resume_from_checkpoint=str(out_dir / "run" / "checkpoint-2"))
    held = {"straight": weights(straight), "resumed": weights(resumed)}
    if algorithm.endswith("_iter"):
        held["shards"], held["resumed_shards"] = round_shards(straight), round_shards(resumed)
    if algorithm == "madpo":
        held["pairs"] = [pair_record(pair) for pair in straight.pairs]
        held["resumed_pairs"] = [pair_record(pair) for pair in resumed.pairs]
    if algorithm == "marlhf":
        held["reward_model"] = reward_model_weights(straight)
        held["resumed_reward_model"] = reward_model_weights(resumed)
    torch.save(held, out_dir / f"rank{rank}.pt")
    info = {"world_size": straight.parallel.world_size, "saved": saved, "steps": straight.global_step}
    info["sharded"] = [straight.learners.names[i] for i in straight.learners.sharded]
    info["optimizer_numel"] = optimizer_numel(straight)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({**info, **{name: m.call_count for name, m in round_files}}))


def run_resume_worker(algorithm: str, out: str, per_device_rows: int, sharding: str, checkpoint: str) -> None:
    """One rank's run that resumes ``checkpoint`` (written by another number of ranks) and
    trains to the end; saves its weights to ``out/rank{rank}.pt``."""
    trainer = build_trainer(algorithm, Path(checkpoint).parent, per_device_rows, sharding)
    trainer.train(resume_from_checkpoint=checkpoint)
    torch.save({"resumed": weights(trainer)}, Path(out) / f"rank{trainer.parallel.rank}.pt")


def optimizer_numel(trainer) -> int:
    """How many numbers of the agents' AdamW states this rank holds (its slices, when sharded)."""
    agents = [f"agent {i}" for i in range(trainer.num_agents)]
    optimizers = [o for name, o in zip(trainer.learners.names, trainer.learners.optimizers) if name in agents]
    states = [value for o in optimizers for state in o.state.values() for value in state.values()]
    return sum(local(value).numel() for value in states if value.dim() > 0)


def round_shards(trainer) -> list[list[dict]]:
    """Every round's pairs, as records, of an iterative trainer (MARLHFIter's rounds are its RL trainer's)."""
    rounds = trainer.rounds
    return [[pair_record(pair) for pair in shard] for shard in rounds.shards]


@contextlib.contextmanager
def counted_round_files() -> Iterator[list[tuple[str, mock.MagicMock]]]:
    """Inside, the writers of the iterative trainers' round files write as they do, and count
    their calls: (name, mock) for the preference_replay shards and the reward histograms."""
    shards = mock.patch.object(PreferenceRounds, "write_shard", autospec=True, side_effect=PreferenceRounds.write_shard)
    histograms = mock.patch.object(reward_histograms, "write_record", side_effect=reward_histograms.write_record)
    with shards as shard_writes, histograms as histogram_writes:
        yield [("shard_writes", shard_writes), ("histogram_writes", histogram_writes)]


# ------------------------------------------------------------------------------ a run to kill (tests/fault_worker.py)
def killable_trainer(output_dir: str):
    """A run long enough (24 steps, a checkpoint after each) to be killed at random moments,
    and deterministic, so a run that was killed and resumed can be compared to a straight one."""
    tok = char_tokenizer()
    args = small_config(
        Path(output_dir).parent,
        num_train_epochs=8,
        per_device_train_batch_size=1,
        save_steps=1,
        save_total_limit=2,
        output_dir=output_dir,
        # A worker killed before its first checkpoint was complete left outputs but nothing to
        # resume: the next one starts afresh over them (a resume never clears anything).
        overwrite_output_dir=True,
    )
    return make_trainer(
        Path(output_dir).parent, agents=[tiny_llama(tok, seed=i) for i in range(2)], tokenizer=tok, args=args
    )


def run_killable(output_dir: str, weights_file: str) -> None:
    """Train, resuming from the newest checkpoint if there is one; save the weights at the end."""
    trainer = killable_trainer(output_dir)
    print("ready", flush=True)
    trainer.train(resume_from_checkpoint=True if complete_checkpoints(output_dir) else None)
    torch.save(weights(trainer), weights_file)


@dataclasses.dataclass(frozen=True)
class AfterTwo:
    """A short joint prompt (keeps the tiny model fast); a response splits after its second
    character, and one that is empty or starts with a letter from a to m cannot be split
    (about half of a random tiny model's)."""

    def build_prompt(self, row, agent_prompts):
        return " : ".join(agent_prompts)

    def parse_completion(self, completion, row, num_agents):
        if unsplittable(completion):
            raise CentralizedComparatorParseError("starts with a to m")
        return [completion[:2], completion[2:]]


def unsplittable(text):
    return not text or text[0] in "abcdefghijklm"
