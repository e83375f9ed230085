"""What a policy-gradient training step logs of its update and its timing: each agent's loss,
clip fraction, KL, entropy, entropy quantile and sampler gap and correction, summed over its
micro-batches and turned into :class:`~comlrl.utils.stats.Stat` s that reduce correctly over data-parallel ranks."""

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
    corrected: float = 0.0
    entropy_threshold: float = 0.0
    """Entropy quantile thresholds, summed over the micro-batches."""
    entropy_kept: float = 0.0
    micro_batches: int = 0

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
        self.corrected += terms.corrected.item()
        self.entropy_threshold += terms.entropy_threshold.item()
        self.entropy_kept += terms.entropy_kept.item()
        self.micro_batches += 1


def agent_update_metrics(
    agent: int,
    totals: UpdateTotals,
    *,
    ratio: bool,
    kl: bool,
    entropy: bool,
    correction: str | None,
    entropy_quantile: bool = False,
) -> dict[str, Stat]:
    """Agent ``agent``'s metrics of one optimizer step: its loss (a share of one normalised over
    every rank's tokens, so ranks' shares add up), and, where they mean something, the clip
    fraction (``ratio``: the update took several optimizer steps), the KL to the reference
    (``kl``), the entropy (``entropy``), the sampler gap (when the sampler gave log-probs), the
    share of sampler weights that the ``correction`` mode truncated (``sampler_ratio_capped``) or
    masked (``sampler_ratio_masked``), and with an ``entropy_quantile`` the mean threshold and the
    share of tokens kept."""
    metrics = {f"agent{agent}/loss": stats.total(totals.loss)}
    if ratio:
        metrics[f"agent{agent}/clip_fraction"] = stats.mean(totals.clipped, totals.tokens)
    if kl:
        metrics[f"agent{agent}/kl"] = stats.mean(totals.kl, totals.tokens)
    if entropy:
        metrics[f"agent{agent}/entropy"] = stats.mean(totals.entropy, totals.tokens)
    if totals.sampler_tokens:
        metrics[f"agent{agent}/sampler_logprob_gap"] = stats.mean(totals.sampler_gap, totals.sampler_tokens)
        if correction is not None:
            action = "masked" if correction.endswith("_mask") else "capped"
            metrics[f"agent{agent}/sampler_ratio_{action}"] = stats.mean(totals.corrected, totals.sampler_tokens)
    if entropy_quantile:
        metrics[f"agent{agent}/entropy_threshold"] = stats.mean(totals.entropy_threshold, totals.micro_batches)
        metrics[f"agent{agent}/entropy_kept"] = stats.mean(totals.entropy_kept, totals.tokens)
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
