"""The candidates preference pairs are made from: every training prompt's joint actions
sampled by the current policy and ranked by the task reward (MADPO's pairs, and MARLHF's,
which its reward model is fitted to)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from comlrl.algorithms import joint_action_indices
from comlrl.engine.run import Run
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.pairs import PreferencePair, node_pairs, pair_statistics, select_pairs, shared_rewards
from comlrl.utils import stats as metric_stats


def check_candidate_budget(config: MADPOConfig, num_agents: int) -> None:
    """Building pairs samples ``per_device_train_batch_size`` rows' candidates at a time: at
    most ``max_generations_per_step`` completions."""
    sampled = config.per_device_train_batch_size * num_agents * config.preference_num_candidates
    if sampled > config.max_generations_per_step:
        raise ValueError(
            f"building pairs samples {sampled} completions at a time (per_device_train_batch_size="
            f"{config.per_device_train_batch_size} rows x {num_agents} agents x preference_num_candidates="
            f"{config.preference_num_candidates}), above max_generations_per_step="
            f"{config.max_generations_per_step}: lower per_device_train_batch_size or preference_num_candidates, "
            "or raise max_generations_per_step"
        )


def sample_preference_pairs(run: Run, args: MADPOConfig, name: str) -> tuple[list[PreferencePair], dict[str, float]]:
    """Sample ``preference_num_candidates`` joint actions per training prompt with ``run``'s
    current policy, score them with its task reward and keep the pairs ``pair_selection``
    picks; returns them and what building them found. ``name`` (the algorithm's: MADPO,
    MARLHF) labels the progress bar and the error. For a centralized run (one model writes
    every role), what was found includes the share of candidates its collaboration could not
    split into roles.

    Under data parallelism each rank samples its share of the rows (and draws
    ``pair_selection="random"``'s order from its own stream, as it samples from its own);
    every rank returns all the pairs, in row order, and what was found over all of them."""
    parallel, collaboration, table = run.parallel, run.collaboration, run.train_prompts
    count = args.preference_num_candidates
    aligned = joint_action_indices(run.num_agents, count, "aligned")
    order = torch.Generator().manual_seed(args.seed + parallel.rank)  # pair_selection="random"'s draws
    rows = parallel.shard(list(range(len(table))))
    chunk = args.per_device_train_batch_size
    pairs: list[PreferencePair] = []
    candidate_rewards = []
    parse_failure_stats = []  # one metric per chunk of rows, centralized only
    chunks = tqdm(
        range(0, len(rows), chunk), desc=f"{name} pairs", unit="batch", dynamic_ncols=True, disable=not parallel.is_main
    )
    for first in chunks:
        batch = rows[first : first + chunk]
        turn = run.rollout(table, batch, num_generations=count, joint_indices=aligned).turns[0]
        rewards = shared_rewards(turn.rewards, turn.rows)  # (M, N)
        candidate_rewards.append(rewards)
        if collaboration is not None:
            parse_failure_stats.append(collaboration.parse_failure_stats(turn, table))
        for m, row in enumerate(turn.rows):
            ranked = select_pairs(rewards[m], args.pair_selection, args.preference_pairs_per_sample, order)
            prompts = [agent_prompts[m] for agent_prompts in turn.prompts]
            pairs.extend(node_pairs(row, prompts, turn.agents, m * count, ranked, rewards[m]))
    pairs = parallel.gather_lists(pairs)
    all_rewards = torch.cat(parallel.gather_lists(candidate_rewards))
    parse_failure_stats = parallel.gather_lists(parse_failure_stats)
    if not pairs:
        raise ValueError(
            f"{name} found no preference pairs: the {count} candidates of each of the {len(all_rewards)} training rows "
            f"all got the same reward (e.g. {all_rewards[0, 0].item():g}), so none is preferred. A constant "
            "reward_func or reward_processor does this; otherwise sample more varied candidates (more "
            "preference_num_candidates, a higher temperature)"
        )
    return pairs, {
        **pair_statistics(all_rewards, pairs),
        **metric_stats.finish(metric_stats.combine(parse_failure_stats)),
    }
