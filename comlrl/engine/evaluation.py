"""A run's evaluation: one episode per evaluation row with the task reward, sampled from
generators seeded by the config's ``seed`` and put back afterwards."""

from __future__ import annotations

import warnings

import torch

from comlrl.engine.run import Run
from comlrl.metrics.evaluation import evaluation_metrics
from comlrl.utils.run_control import seeded_cuda_devices


def evaluate(run: Run, discount: float, num_eval_samples: int | None = None) -> dict[str, float]:
    """Score the first ``eval_num_samples`` rows of ``eval_dataset``: one episode per row
    (one sample per agent and turn, greedy or sampled as ``eval_do_sample`` says), with
    the reward mean over all turns, the reward and expected return of each turn, and the
    metrics of the ``eval_logger`` hook. Returns are discounted by ``discount`` (the objective's).

    Sampling uses generators seeded by ``seed``, and every generator (the CPU's and each
    GPU's) is put back afterwards: evaluations of the same weights agree, and evaluating
    during training does not change the training samples.
    """
    if run.eval_prompts is None:
        warnings.warn(
            "evaluate() without an eval_dataset scores nothing: pass eval_dataset= to the trainer", stacklevel=2
        )
        return {}
    args = run.config
    count = args.eval_num_samples if num_eval_samples is None else num_eval_samples
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"num_eval_samples must be an integer >= 1 or None (all rows), got {count!r}")
    rows = list(range(len(run.eval_prompts)))[:count]
    single_path = torch.zeros(1, run.num_agents, dtype=torch.long)
    sampling = run.sampling if args.eval_do_sample else run.sampling.greedy()
    # manual_seed reseeds the CPU's generator and every GPU's: all of them are put back.
    with torch.random.fork_rng(devices=seeded_cuda_devices(), device_type="cuda"):
        torch.manual_seed(args.seed)
        trees = [
            run.rollout(
                run.eval_prompts,
                rows[first : first + args.eval_batch_size],
                num_generations=1,
                joint_indices=single_path,
                sampling=sampling,
            )
            for first in range(0, len(rows), args.eval_batch_size)
        ]
    metrics, completions = evaluation_metrics(trees, discount, args.num_turns)
    metrics.update(
        run.eval_hooks(
            completions,
            [run.eval_prompts.rows[r] for r in rows],
            run.eval_prompts.row_prompts(rows),
            args.num_turns,
        )
    )
    if run.metrics_callback.callback is not None:
        metrics.update(run.metrics_callback.evaluation(trees, discount, run.eval_prompts))
    return metrics
