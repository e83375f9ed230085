"""Data parallelism on CPU (gloo): two ranks launched with torchrun keep identical weights,
match one process over the same global batch, write files from rank 0 only, and resume;
MADPO's ranks hold the same preference pairs; MARLHF's ranks fit the reward model one process
fits, each on its share of every batch; MADPOIter's ranks hold the same rounds of pairs and
resume exactly, and MARLHFIter's ranks keep identical weights."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from comlrl.algorithms import bradley_terry_loss, pair_accuracy
from comlrl.checkpoint.files import OPTIMIZER_SHARDS
from comlrl.engine.distributed import DataParallel
from comlrl.models.placement import resolve_agent_devices
from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers.reinforce import MAGRPOConfig
from comlrl.trainers.rlhf import MARLHFConfig, MARLHFTrainer
from comlrl.trainers.rlhf import reward_model as reward_fit

from .helpers import (
    DATA,
    MADPO_ROWS,
    build_trainer,
    char_tokenizer,
    checkpoint_pairs,
    content_score,
    make_trainer,
    marlhf_pairs,
    reward_backbone,
    run_ddp_worker,
    tiny_llama,
    weights,
)

REPO = Path(__file__).resolve().parents[1]


def torchrun(
    algorithm: str, out: Path, ranks: int, per_device_rows: int, sharding: str = "replicate", resume: Path | None = None
) -> None:
    """``ranks`` ranks of ``run_ddp_worker(algorithm, out, per_device_rows, sharding=sharding)``
    under torchrun; with ``resume``, of ``run_resume_worker`` from that checkpoint."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    command += ["-m", "tests.ddp_worker", algorithm, str(out), str(per_device_rows), sharding]
    command += [] if resume is None else [str(resume)]
    finished = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]


SHARDED = [("magrpo", "full_shard"), ("magrpo", "shard_grad_op"), ("iac", "full_shard"), ("maac", "full_shard")]
SHARDED += [("madpo", "full_shard"), ("centralized", "full_shard"), ("marlhf", "full_shard")]
SHARDED += [("lora", "full_shard"), ("shared_lora", "shard_grad_op")]


@pytest.mark.parametrize(
    "algorithm, sharding",
    [(a, "replicate") for a in ("magrpo", "iac", "madpo", "marlhf", "centralized", "environment", "environment_tools")]
    + SHARDED,
)
def test_two_ranks_equal_one_process_over_the_same_global_batch(tmp_path, algorithm, sharding, monkeypatch):
    """2 ranks x 2 rows (MADPO: pairs) per step against 1 process x 4. The RL trainers sample
    greedily, so both set-ups sample the same completions. MADPO's ranks sample their rows'
    candidates from their own random streams, so one process would build other pairs: its
    single process trains on the pairs the ranks built (read from their checkpoint), and the
    ranks' pair building is checked on its own (same pairs on both ranks, in row order, with
    the reference margins one process computes). MADPO's 21 pairs leave rank 1 without a pair
    at the last step of each epoch. MARLHF's reward model is fitted to the same given pairs in
    both set-ups (its last batch leaves rank 1 without a pair), then MAREINFORCE on its scores.
    Sharded (FSDP2), the ranks hold the same whole weights after every step, as one process
    does within float error (sums over ranks in another order); MAAC's separate critic and
    MARLHF's reward model stay replicated beside the sharded agents, and centralized MAGRPO's
    one model (writing both roles) is sharded as an agent is. In an environment (two turns),
    each rank plays its rows' episodes as one process plays them; with tools
    (``environment_tools``), each rank runs its rows' calls and continues them."""
    torchrun(algorithm, tmp_path / "ddp", ranks=2, per_device_rows=2, sharding=sharding)
    for variable in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    built_pairs = tmp_path / "ddp" / "run" / "checkpoint-2" if algorithm == "madpo" else None
    run_ddp_worker(algorithm, str(tmp_path / "single"), per_device_rows=4, pairs_from=built_pairs)

    rank0, rank1 = (torch.load(tmp_path / "ddp" / f"rank{r}.pt") for r in (0, 1))
    single = torch.load(tmp_path / "single" / "rank0.pt")
    for a, b in zip(rank0["straight"], rank1["straight"]):
        assert torch.equal(a, b)  # the ranks hold identical weights
    initial_trainer = build_trainer(algorithm, tmp_path / "unused", per_device_rows=4)
    initial = weights(initial_trainer)
    if algorithm == "madpo":
        check_ranks_pairs(rank0, rank1, initial_trainer, built_pairs)
    if algorithm == "marlhf":
        check_reward_models(rank0, rank1, single, tmp_path / "ddp" / "reward_backbone_rank0")
    for a, b, start in zip(rank0["straight"], single["straight"], initial):
        assert not torch.equal(a, start)  # training moved every agent (and value head)
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    for a, b in zip(rank0["resumed"], rank0["straight"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)

    info = [json.loads((tmp_path / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1)]
    steps = 12 if algorithm == "madpo" else 4  # 2 epochs; MADPO: 21 pairs at 4 per step, 6 steps each
    assert [i["world_size"] for i in info] == [2, 2] and [i["steps"] for i in info] == [steps, steps]
    # AdamW keeps two numbers per trained parameter: all of them on each rank, or half when sharded.
    whole = 2 * sum(p.numel() for group in initial_trainer.agents.parameters for p in group)
    if sharding == "replicate":
        assert [i["sharded"] for i in info] == [[], []] and [i["optimizer_numel"] for i in info] == [whole, whole]
    else:
        assert [i["sharded"] for i in info] == [[f"agent {a}" for a in range(len(initial_trainer.agents))]] * 2
        assert sum(i["optimizer_numel"] for i in info) == whole
        assert all(i["optimizer_numel"] <= 0.55 * whole for i in info)
        check_sharded_outputs(tmp_path / "ddp", rank0["straight"], len(initial_trainer.agents), algorithm)
    if algorithm in ("lora", "shared_lora"):
        check_merged_models(tmp_path / "ddp", len(initial_trainer.agents), algorithm)
    assert info[0]["saved"] and info[1]["saved"] == []  # only rank 0 writes models
    run = tmp_path / "ddp" / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if algorithm == "madpo":  # what building the pairs found, logged once before the first step
        assert lines[0]["step"] == 0 and lines[0]["preference/num_pairs"] == 21
        lines = lines[1:]
    first = 1
    if algorithm == "marlhf":  # the reward model's fit, logged before the first step by both set-ups
        first = 0
        assert (lines[0]["reward_model/train_pairs"], lines[0]["reward_model/eval_pairs"]) == (9, 3)
        assert (run / "reward_model" / "reward_head.safetensors").exists()
    assert [line["step"] for line in lines] == list(range(first, steps + 1))  # one writer, the resumed steps once
    checkpoints = sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == sorted(f"checkpoint-{step}" for step in range(2, steps + 1, 2))
    generators = torch.load(run / "checkpoint-2" / "rng_state.pt")
    assert "torch" in generators and "rank1/torch" in generators
    single_lines = [
        json.loads(line) for line in (tmp_path / "single" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(single_lines) == len(lines)
    for ours, theirs in zip(lines, single_lines):  # every metric is reduced over the ranks as it was formed
        assert ours.keys() == theirs.keys()
        for key in ours:
            if not key.startswith("time/"):  # each rank's clock, not the batch's
                # abs: a loss near 0 is a sum of cancelling terms, each ~1e-2 with float32 error ~1e-7
                assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=2e-6), key


def check_sharded_outputs(out: Path, straight: list[torch.Tensor], num_agents: int, algorithm: str) -> None:
    """A sharded run's save_model wrote whole models (gathered from both ranks) that load as
    the trained agents (LoRA agents: adapters that load on rank 0's initial base as them);
    its checkpoints hold each rank's optimizer slices, in the manifest."""
    for i in range(num_agents):
        saved = saved_agent(out / "saved", i, algorithm)
        assert torch.equal(torch.cat([p.detach().reshape(-1) for p in saved.parameters()]), straight[i])
    checkpoint = out / "run" / "checkpoint-2"
    shards = sorted(p.name for p in (checkpoint / OPTIMIZER_SHARDS).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    listed = json.loads((checkpoint / "manifest.json").read_text())["files"]
    assert {f"{OPTIMIZER_SHARDS}/{name}" for name in shards} <= listed.keys()
    assert torch.load(checkpoint / "optimizer.pt")["sharded"] == [f"agent {i}" for i in range(num_agents)]


def check_merged_models(out: Path, num_agents: int, algorithm: str) -> None:
    """``save_model(merge_adapters=True)`` wrote each agent as one whole model: its saved
    adapter merged into its base."""
    for i in range(num_agents):
        merged = AutoModelForCausalLM.from_pretrained(out / "merged" / f"agent_{i}")
        peft_model = saved_agent(out / "saved", i, algorithm)
        if algorithm == "shared_lora":
            peft_model.set_adapter(f"agent_{i}")
            expected = peft_model.merge_and_unload(adapter_names=[f"agent_{i}"])
        else:
            expected = peft_model.merge_and_unload()
        theirs = dict(expected.named_parameters())
        assert dict(merged.named_parameters()).keys() == theirs.keys()
        for name, tensor in merged.named_parameters():
            torch.testing.assert_close(tensor, theirs[name], atol=1e-6, rtol=0)


def saved_agent(folder: Path, agent: int, algorithm: str) -> torch.nn.Module:
    """What save_model wrote of agent ``agent`` as the trainer holds it: the model, or its
    adapter on the base (``"shared_lora"``: every agent's adapter on one base)."""
    if algorithm not in ("lora", "shared_lora"):
        return AutoModelForCausalLM.from_pretrained(folder / f"agent_{agent}")
    if algorithm == "lora":
        return PeftModel.from_pretrained(tiny_llama(char_tokenizer(), seed=agent), folder / f"agent_{agent}")
    shared = PeftModel.from_pretrained(tiny_llama(char_tokenizer(), seed=0), folder / "agent_0", "agent_0")
    shared.load_adapter(folder / "agent_1", "agent_1")
    return shared


def check_ranks_pairs(rank0: dict, rank1: dict, initial_trainer, checkpoint: Path) -> None:
    """Both ranks hold the same pairs, resumed or not, as the checkpoint does: each row's 3,
    in row order, with the reference margins one process computes on the whole list."""
    assert rank0["pairs"] == rank1["pairs"] == rank0["resumed_pairs"] == rank1["resumed_pairs"]
    assert [pair["row"] for pair in rank0["pairs"]] == [row for row in range(len(MADPO_ROWS)) for _ in range(3)]
    pairs = checkpoint_pairs(checkpoint)
    assert [pair["chosen_texts"] for pair in rank0["pairs"]] == [pair.chosen_texts for pair in pairs]
    unreferenced = [dataclasses.replace(pair, reference_deltas=None) for pair in pairs]
    expected = torch.tensor([pair.reference_deltas for pair in initial_trainer.objective.with_reference(unreferenced)])
    torch.testing.assert_close(torch.tensor([pair["reference_deltas"] for pair in rank0["pairs"]]), expected)


def check_reward_models(rank0: dict, rank1: dict, single: dict, backbone: Path) -> None:
    """Both ranks fitted the same reward model (rank 1's transformer started from other weights:
    rank 0's were broadcast), which one process fits within float error, and read it back
    from the checkpoint when resuming; the fit moved the head (from 0) and the transformer."""
    for a, b, resumed0, resumed1 in zip(
        rank0["reward_model"], rank1["reward_model"], rank0["resumed_reward_model"], rank1["resumed_reward_model"]
    ):
        assert torch.equal(a, b) and torch.equal(a, resumed0) and torch.equal(a, resumed1)
    for a, b in zip(rank0["reward_model"], single["reward_model"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    head, _, embeddings = rank0["reward_model"]
    assert head.abs().sum() > 0
    initial = JointRewardModel.from_pretrained(str(backbone)).backbone.get_input_embeddings().weight
    assert not torch.equal(embeddings, initial)


def test_shards_of_a_step_cover_its_rows_once():
    rows = list(range(7))
    shares = [DataParallel(rank=r, world_size=3).shard(rows) for r in range(3)]
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert DataParallel().shard(rows) == rows


def test_gathered_shards_are_the_whole_list_in_order(monkeypatch):
    items = list(range(7))
    assert DataParallel().gather_lists(items) is items  # one process: nothing to gather
    shares = [DataParallel(rank=r, world_size=3).shard(items) for r in range(3)]
    monkeypatch.setattr(DataParallel, "gather", lambda self, value: shares)  # what all_gather_object returns
    assert DataParallel(rank=1, world_size=3).gather_lists(shares[1]) == items


def fit_as_before(model, pairs, epochs, batch_size, learning_rate, max_grad_norm, generator):
    """fit_reward_model as it was before it took ``parallel``: every batch's loss in one process."""
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=learning_rate)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(pairs), generator=generator).tolist()
        losses, accuracies = [], []
        for first in range(0, len(pairs), batch_size):
            batch = [pairs[k] for k in order[first : first + batch_size]]
            chosen, rejected = model.scores(reward_fit.pair_texts(batch)).chunk(2)
            loss = bradley_terry_loss(chosen, rejected)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            accuracies.append(pair_accuracy(chosen.detach(), rejected.detach()).item())
    return sum(losses) / len(losses), sum(accuracies) / len(accuracies)


def test_one_process_fits_and_scores_the_reward_model_as_before():
    """With the non-distributed DataParallel the fit and the held-out scores are bit for bit
    what they were: each share's weight is exactly 1."""
    pairs = marlhf_pairs()
    fitted, reference = (JointRewardModel(tiny_llama(char_tokenizer()), char_tokenizer()) for _ in range(2))
    scores = reward_fit.fit_reward_model(
        fitted, pairs, 2, 5, 1e-2, 0.5, torch.Generator().manual_seed(3), DataParallel()
    )
    assert scores == fit_as_before(reference, pairs, 2, 5, 1e-2, 0.5, torch.Generator().manual_seed(3))
    for a, b in zip(fitted.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    chosen, rejected = reference.score_texts(reward_fit.pair_texts(pairs), 4).chunk(2)
    held = reward_fit.score_pairs(fitted, pairs, 4, DataParallel())
    assert held == (bradley_terry_loss(chosen, rejected).item(), pair_accuracy(chosen, rejected).item())


def test_the_shares_of_a_batch_add_up_to_its_loss_accuracy_and_gradient():
    """Two ranks' weighted shares of a batch of 3 pairs (2 and 1) make the batch's mean loss,
    accuracy and gradient; a batch of 1 pair leaves rank 1 a share that scores 0."""
    model = JointRewardModel(tiny_llama(char_tokenizer()), char_tokenizer())
    torch.nn.init.normal_(model.head.weight)  # a head at zero ranks nothing
    batch = marlhf_pairs()[:3]

    def loss_accuracy_gradient(share, batch_pairs):
        model.zero_grad()
        loss, accuracy = reward_fit.scored_share(model.scores, share, batch_pairs)
        loss.backward()
        return loss.item(), accuracy, model.head.weight.grad.clone()

    shares = [DataParallel(rank=r, world_size=2).shard(batch) for r in range(2)]
    assert [len(share) for share in shares] == [2, 1]
    parts = [loss_accuracy_gradient(share, len(batch)) for share in shares]
    whole = loss_accuracy_gradient(batch, len(batch))
    assert parts[0][0] + parts[1][0] == pytest.approx(whole[0], rel=1e-6)
    assert parts[0][1] + parts[1][1] == pytest.approx(whole[1])
    torch.testing.assert_close(parts[0][2] + parts[1][2], whole[2])
    assert DataParallel(rank=1, world_size=2).shard(batch[:1]) == []
    loss, accuracy = reward_fit.scored_share(model.scores, [], 1)
    assert (loss.item(), accuracy) == (0.0, 0.0)


def test_marlhf_builds_under_torchrun_and_fits_with_the_trainers_ranks(tmp_path, monkeypatch):
    # Two ranks without a process group: the weights' broadcast has nothing to do.
    monkeypatch.setattr(DataParallel, "from_environment", classmethod(lambda cls: cls(rank=0, world_size=2)))
    monkeypatch.setattr(DataParallel, "broadcast_parameters", lambda self, parameters: None)
    tok = char_tokenizer()
    args = MARLHFConfig(
        per_device_train_batch_size=1,
        preference_num_candidates=2,
        num_generations=2,
        max_new_tokens=4,
        reward_model_name=reward_backbone(tmp_path / "model", seed=0),
        output_dir=str(tmp_path / "run"),
    )
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    trainer = MARLHFTrainer(agents=agents, tokenizer=tok, train_dataset=DATA[:2], reward_func=content_score, args=args)
    # The stage keeps no ranks of its own: it fits with those of the trainer it is given.
    assert trainer.parallel == DataParallel(rank=0, world_size=2)
    assert not hasattr(trainer.reward_source, "parallel")


@pytest.mark.parametrize("sharding", ["replicate", "full_shard"])
def test_madpo_iter_ranks_hold_the_same_rounds_and_resume_exactly(tmp_path, sharding):
    """2 ranks, 2 rounds of MADPOIter (history comparator, reference margins, reward
    histograms), then a run resumed from checkpoint-2, in round 1. Each rank samples its
    share of the rows, the current candidates and the comparator's, from its own random
    streams, so one process would build other pairs and is not compared with: the ranks
    must hold the same pairs in every round (rank 1's rows included, in row order), keep
    identical weights, and resume exactly; only rank 0 writes the round files. Sharded, the
    history comparator samples with whole copies gathered from the slices: its pairs are
    the replicated run's, and the weights equal theirs (2e-5)."""
    torchrun("madpo_iter", tmp_path, ranks=2, per_device_rows=2, sharding=sharding)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    if sharding != "replicate":
        (tmp_path / "replicated").mkdir()
        torchrun("madpo_iter", tmp_path / "replicated", ranks=2, per_device_rows=2)
        replicated = torch.load(tmp_path / "replicated" / "rank0.pt")
        assert len(rank0["shards"]) == len(replicated["shards"])
        for ours, theirs in zip(rank0["shards"], replicated["shards"]):  # the same tokens, margins to float error
            assert [{**p, "reference_deltas": None} for p in ours] == [{**p, "reference_deltas": None} for p in theirs]
            for p, q in zip(ours, theirs):
                assert p["reference_deltas"] == pytest.approx(q["reference_deltas"], abs=1e-4)
        for a, b in zip(rank0["straight"], replicated["straight"], strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    assert len(rank0["shards"]) == 2
    assert rank0["shards"] == rank1["shards"] == rank0["resumed_shards"] == rank1["resumed_shards"]
    for shard in rank0["shards"]:
        rows = [pair["row"] for pair in shard]
        assert rows == sorted(rows) and rows[0] < 4 <= rows[-1]  # rank 0's rows 0-3, then rank 1's 4-6
        assert all(pair["reference_deltas"] is not None for pair in shard)
    for a, b, resumed0, resumed1 in zip(rank0["straight"], rank1["straight"], rank0["resumed"], rank1["resumed"]):
        assert torch.equal(a, b)
        torch.testing.assert_close(resumed0, a, atol=1e-6, rtol=0)
        torch.testing.assert_close(resumed1, a, atol=1e-6, rtol=0)

    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert info[0]["steps"] == info[1]["steps"] > 2
    # Rank 0 wrote both rounds' files, then round 2's again when resumed; rank 1 none.
    assert [(i["shard_writes"], i["histogram_writes"]) for i in info] == [(3, 3), (0, 0)]
    run = tmp_path / "run"
    for folder in ("preference_replay", "reward_distributions"):
        assert sorted(path.name for path in (run / folder).iterdir()) == ["iteration_0001.json", "iteration_0002.json"]
    for index, shard in enumerate(rank0["shards"]):
        written = json.loads((run / "preference_replay" / f"iteration_{index + 1:04d}.json").read_text())
        assert written["pairs"] == json.loads(json.dumps(shard))
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # One writer, the resumed steps and round 2's start once.
    assert [line["iter/current_iteration"] for line in lines if "iter/current_iteration" in line] == [1.0, 2.0]
    assert [line["step"] for line in lines if "dpo/loss" in line] == list(range(1, info[0]["steps"] + 1))


@pytest.mark.parametrize("sharding", ["replicate", "full_shard"])
def test_marlhf_iter_ranks_keep_identical_weights(tmp_path, sharding):
    """2 ranks, 2 rounds of MARLHFIter: the same pairs on both ranks, one reward model fitted
    together each round, identical agents, straight and resumed from checkpoint-2 (the end of
    round 1); only rank 0 writes the round's pairs. Its ranks sample from their own streams,
    so one process is not compared with."""
    torchrun("marlhf_iter", tmp_path, ranks=2, per_device_rows=2, sharding=sharding)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0["shards"] == rank1["shards"] == rank0["resumed_shards"] == rank1["resumed_shards"]
    assert len(rank0["shards"]) == 2 and all(rank0["shards"])
    for a, b, resumed0, resumed1 in zip(rank0["straight"], rank1["straight"], rank0["resumed"], rank1["resumed"]):
        assert torch.equal(a, b) and torch.equal(resumed0, a) and torch.equal(resumed1, a)
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [i["shard_writes"] for i in info] == [3, 0]  # both rounds, round 2 again when resumed; rank 0 only


def test_a_last_step_with_fewer_rows_than_ranks_is_refused_at_start_up(tmp_path, monkeypatch):
    monkeypatch.setattr(DataParallel, "from_environment", classmethod(lambda cls: cls(rank=0, world_size=2)))
    # 3 rows, 2 ranks x 1 row per step: the second step holds 1 row for 2 ranks.
    args = MAGRPOConfig(per_device_train_batch_size=1, num_generations=2, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"train_dataset has 3 rows; with 2 ranks x per_device_train_batch_size=1"):
        make_trainer(tmp_path, args=args)


def test_agent_devices_on_cpu(tmp_path):
    assert resolve_agent_devices(None, 2) is None
    if not torch.cuda.is_available():
        assert resolve_agent_devices("auto", 2) == [torch.device("cpu")] * 2
    assert resolve_agent_devices("cpu", 3) == [torch.device("cpu")] * 3
    args = MAGRPOConfig(
        agent_devices=["cpu", "cpu"], num_train_epochs=1, num_generations=2, max_new_tokens=4, output_dir=str(tmp_path)
    )
    trainer = make_trainer(tmp_path, args=args)
    assert trainer.train().global_step == 2
    assert all(next(agent.parameters()).device.type == "cpu" for agent in trainer.agents)


@pytest.mark.parametrize(
    "devices,match",
    [
        (["cpu"], r"agent_devices lists 1 devices for 2 agents"),
        (["cpu", "tpu:9"], r"agent_devices\[1\]='tpu:9' is not a device"),
        (["cpu", "cuda:7"], r"agent_devices\[1\]='cuda:7' but .*visible"),
    ],
)
def test_bad_agent_devices_are_named(devices, match):
    with pytest.raises(ValueError, match=match):
        resolve_agent_devices(devices, 2)


def test_agent_devices_type_is_checked():
    with pytest.raises(ValueError, match="agent_devices must be None, 'auto', a device name or a list"):
        MAGRPOConfig(agent_devices=[0, 1])
