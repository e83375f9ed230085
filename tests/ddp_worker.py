"""A training script for tests/test_distributed.py, launched with torchrun: every rank
trains the same tiny agents on its share of each step's rows, resumes from a mid-run
checkpoint, and saves what it holds."""

import json
import sys
from pathlib import Path

import torch

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAREINFORCEConfig, MAREINFORCETrainer
from tests.conftest import char_tokenizer, tiny_llama

ROWS = [{"prompt": text} for text in ["a cat", "hello", "why?", "go on", "the sea", "rain", "a b c", "yes"]]


def score(prompts, a, b):
    """Differs between rows (through the prompt), so advantages have a spread to whiten."""
    return [float(len(p) + x.count("a") - y.count("e")) for p, x, y in zip(prompts, a, b)]


def build_trainer(algorithm: str, output_dir: Path, per_device_rows: int):
    """top_k=1 samples deterministically, so any split of the rows over ranks samples the
    same completions as one process would."""
    tok = char_tokenizer()
    common = dict(
        num_train_epochs=2,
        per_device_train_batch_size=per_device_rows,
        num_generations=2,
        max_new_tokens=6,
        top_k=1,
        logging_steps=1,
        save_steps=2,
        agent_learning_rate=1e-3,
        micro_batch_size=3,
        output_dir=str(output_dir),
    )
    if algorithm == "iac":
        trainer_class, args = IACTrainer, IACConfig(critic_learning_rate=1e-3, **common)
    else:
        trainer_class, args = MAREINFORCETrainer, MAREINFORCEConfig(**common)
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    return trainer_class(agents=agents, tokenizer=tok, train_dataset=ROWS, reward_func=score, args=args)


def weights(trainer) -> list[torch.Tensor]:
    modules = list(trainer.agents) + [critic.head for critic in getattr(trainer, "critics", [])]
    return [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in modules]


def main(algorithm: str, out: str, per_device_rows: int) -> None:
    out_dir = Path(out)
    straight = build_trainer(algorithm, out_dir / "run", per_device_rows)
    straight.train()
    rank = straight.parallel.rank
    saved = straight.save_model(str(out_dir / "saved"))
    resumed = build_trainer(algorithm, out_dir / "run", per_device_rows)
    resumed.train(resume_from_checkpoint=str(out_dir / "run" / "checkpoint-2"))
    torch.save({"straight": weights(straight), "resumed": weights(resumed)}, out_dir / f"rank{rank}.pt")
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps({"world_size": straight.parallel.world_size, "saved": saved, "steps": straight.global_step})
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
