"""Digests of seeded tiny MAGRPO runs, to show that a change keeps today's numbers bit for bit.

    .venv/bin/python benchmarks/seeded_digest.py > after.json
    git stash && .venv/bin/python benchmarks/seeded_digest.py > before.json && git stash pop
    diff before.json after.json && echo identical

Three runs of the test suite's tiny trainer (tests/helpers.py: two tiny Llama agents, a
character tokenizer, 3 prompts, G = 2, 6 tokens, seed 3): the defaults, two optimizer steps
per rollout (``num_iterations=2``: the ratio and the clip at work), and bf16 with two steps
(the sampler correction at work). Printed per run, as one JSON object: the SHA-256 of every
agent's final weights, the SHA-256 of every logged metric but the timings, and the last
step's metrics. Digests compare runs on one machine: another CPU may round differently.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.helpers import make_trainer, small_config  # noqa: E402

RUNS = {"default": {}, "iterations_2": {"num_iterations": 2}, "bf16": {"precision": "bf16", "num_iterations": 2}}


def digest(overrides: dict) -> dict:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        trainer = make_trainer(tmp, args=small_config(tmp, seed=3, **overrides))
        trainer.train()
        weights = hashlib.sha256()
        for agent in trainer.agents:
            for parameter in agent.parameters():
                weights.update(parameter.detach().float().numpy().tobytes())
        lines = (tmp / "run" / "metrics.jsonl").read_text().splitlines()
        logged = [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines]
    metrics = hashlib.sha256(json.dumps(logged, sort_keys=True).encode()).hexdigest()
    return {"weights": weights.hexdigest(), "metrics": metrics, "last_step": logged[-1]}


def main() -> None:
    results = {}
    for name, overrides in RUNS.items():
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                results[name] = digest(overrides)
            finally:
                sys.stdout = stdout
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
