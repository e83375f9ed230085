"""Data parallelism on CPU (gloo): two ranks launched with torchrun keep identical weights,
match one process over the same global batch, write files from rank 0 only, and resume;
MADPO's ranks hold the same preference pairs; MADPOIter refuses torchrun."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comlrl.distributed import DataParallel
from comlrl.models.placement import resolve_agent_devices
from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer
from comlrl.trainers.reinforce import MAGRPOConfig

from .helpers import (
    DATA,
    MADPO_ROWS,
    build_trainer,
    char_tokenizer,
    checkpoint_pairs,
    content_score,
    make_trainer,
    run_ddp_worker,
    tiny_llama,
    weights,
)

REPO = Path(__file__).resolve().parents[1]


def torchrun(algorithm: str, out: Path, ranks: int, per_device_rows: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    command += ["-m", "tests.ddp_worker", algorithm, str(out), str(per_device_rows)]
    finished = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]


@pytest.mark.parametrize("algorithm", ["magrpo", "iac", "madpo"])
def test_two_ranks_equal_one_process_over_the_same_global_batch(tmp_path, algorithm, monkeypatch):
    """2 ranks x 2 rows (MADPO: pairs) per step against 1 process x 4. The RL trainers sample
    greedily, so both set-ups sample the same completions. MADPO's ranks sample their rows'
    candidates from their own random streams, so one process would build other pairs: its
    single process trains on the pairs the ranks built (read from their checkpoint), and the
    ranks' pair building is checked on its own (same pairs on both ranks, in row order, with
    the reference margins one process computes). MADPO's 21 pairs leave rank 1 without a pair
    at the last step of each epoch."""
    torchrun(algorithm, tmp_path / "ddp", ranks=2, per_device_rows=2)
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
    for a, b, start in zip(rank0["straight"], single["straight"], initial):
        assert not torch.equal(a, start)  # training moved every agent (and value head)
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    for a, b in zip(rank0["resumed"], rank0["straight"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)

    info = [json.loads((tmp_path / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1)]
    steps = 12 if algorithm == "madpo" else 4  # 2 epochs; MADPO: 21 pairs at 4 per step, 6 steps each
    assert [i["world_size"] for i in info] == [2, 2] and [i["steps"] for i in info] == [steps, steps]
    assert info[0]["saved"] and info[1]["saved"] == []  # only rank 0 writes models
    run = tmp_path / "ddp" / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if algorithm == "madpo":  # what building the pairs found, logged once before the first step
        assert lines[0]["step"] == 0 and lines[0]["preference/num_pairs"] == 21
        lines = lines[1:]
    assert [line["step"] for line in lines] == list(range(1, steps + 1))  # one writer, the resumed steps once
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


def check_ranks_pairs(rank0: dict, rank1: dict, initial_trainer, checkpoint: Path) -> None:
    """Both ranks hold the same pairs, resumed or not, as the checkpoint does: each row's 3,
    in row order, with the reference margins one process computes on the whole list."""
    assert rank0["pairs"] == rank1["pairs"] == rank0["resumed_pairs"] == rank1["resumed_pairs"]
    assert [pair["row"] for pair in rank0["pairs"]] == [row for row in range(len(MADPO_ROWS)) for _ in range(3)]
    pairs = checkpoint_pairs(checkpoint)
    assert [pair["chosen_texts"] for pair in rank0["pairs"]] == [pair.chosen_texts for pair in pairs]
    unreferenced = [dataclasses.replace(pair, reference_deltas=None) for pair in pairs]
    expected = torch.tensor([pair.reference_deltas for pair in initial_trainer.with_reference(unreferenced)])
    torch.testing.assert_close(torch.tensor([pair["reference_deltas"] for pair in rank0["pairs"]]), expected)


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


def test_madpo_iter_refuses_torchrun(tmp_path, monkeypatch):
    # Two ranks without a process group: the weights' broadcast has nothing to do.
    monkeypatch.setattr(DataParallel, "from_environment", classmethod(lambda cls: cls(rank=0, world_size=2)))
    monkeypatch.setattr(DataParallel, "broadcast_parameters", lambda self, parameters: None)
    tok = char_tokenizer()
    args = MADPOIterConfig(
        per_device_train_batch_size=1, preference_num_candidates=2, max_new_tokens=4, output_dir=str(tmp_path)
    )
    with pytest.raises(ValueError, match=r"MADPOIterTrainer does not run under torchrun yet"):
        MADPOIterTrainer(
            agents=[tiny_llama(tok, seed=i) for i in range(2)],
            tokenizer=tok,
            train_dataset=DATA[:2],
            reward_func=content_score,
            args=args,
        )


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
