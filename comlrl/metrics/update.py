"""What a policy-gradient training step logs of its update and its timing: each agent's loss,
clip fraction, KL, entropy and sampler gap, summed over its micro-batches and turned into
:class:`~comlrl.utils.stats.Stat` s that reduce correctly over data-parallel ranks."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.algorithms.policy_terms import PolicyTerms
from comlrl.utils import stats
from comlrl.utils.stats import Stat


@dataclass
class UpdateTotals:
    """One agent's sums over the micro-batches of one optimizer step."""

    loss: float = 0.0
    clipped: float = 0.0
    """Clip fraction times tokens, summed."""
    kl: float = 0.0
    entropy: float = 0.0
    tokens: float = 0.0
    sampler_gap: float = 0.0
    sampler_tokens: float = 0.0
    capped: float = 0.0

    def add(self, terms: PolicyTerms, tokens: float) -> None:
        """A micro-batch's ``terms`` over its ``tokens`` completion tokens."""
        out = terms.loss
        self.loss += out.loss.item()
        self.clipped += out.clip_fraction.item() * tokens
        self.kl += out.kl.item() * tokens
        self.entropy += out.entropy.item() * tokens
        self.tokens += tokens
        self.sampler_gap += terms.sampler_gap.item()
        self.sampler_tokens += terms.sampler_tokens.item()
        self.capped += terms.capped.item()


def agent_update_metrics(
    agent: int, totals: UpdateTotals, *, ratio: bool, kl: bool, entropy: bool, capped: bool
) -> dict[str, Stat]:
    """Agent ``agent``'s metrics of one optimizer step: its loss (a share of one normalised over
    every rank's tokens, so ranks' shares add up), and, where they mean something, the clip
    fraction (``ratio``: the update took several optimizer steps), the KL to the reference
    (``kl``), the entropy (``entropy``), the sampler gap (when the sampler gave log-probs) and the
    share of capped sampler weights (``capped``: a ``sampler_ratio_cap`` is set)."""
    metrics = {f"agent{agent}/loss": stats.total(totals.loss)}
    if ratio:
        metrics[f"agent{agent}/clip_fraction"] = stats.mean(totals.clipped, totals.tokens)
    if kl:
        metrics[f"agent{agent}/kl"] = stats.mean(totals.kl, totals.tokens)
    if entropy:
        metrics[f"agent{agent}/entropy"] = stats.mean(totals.entropy, totals.tokens)
    if totals.sampler_tokens:
        metrics[f"agent{agent}/sampler_logprob_gap"] = stats.mean(totals.sampler_gap, totals.sampler_tokens)
        if capped:
            metrics[f"agent{agent}/sampler_ratio_capped"] = stats.mean(totals.capped, totals.sampler_tokens)
    return metrics


def step_time_metrics(started: float, generated: float, updated: float, generated_tokens: int) -> dict[str, Stat]:
    """A step's timing from its ``perf_counter`` marks (start, rollout done, update done):
    ranks work side by side, so a step lasts as long as the slowest and their throughputs add."""
    return {
        "time/generate_s": stats.maximum(generated - started),
        "time/update_s": stats.maximum(updated - generated),
        "time/step_s": stats.maximum(updated - started),
        "time/generated_tokens_per_s": stats.total(generated_tokens / max(generated - started, 1e-9)),
    }
