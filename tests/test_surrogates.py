"""The policy-gradient toolbox against hand computations on tiny tensors: GSPO's sequence ratio,
two-sided clipping, CISPO, SAPO, the sampler corrections by token and by sequence, the
top-entropy mask; then each setting through a seeded MAGRPO run."""

import math

import pytest
import torch

from comlrl.algorithms import (
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
    SAMPLER_CORRECTIONS,
    PolicyObjective,
    SamplerCorrection,
    micro_batch_policy_terms,
    policy_gradient_loss,
    policy_surrogate,
    sampler_importance_weights,
    token_weights,
    top_entropy_mask,
)
from comlrl.algorithms.surrogates import sequence_log_ratio
from tests.helpers import make_trainer, small_config, snapshot, unchanged

MASK = torch.tensor([[True, True, False], [True, True, True]])  # sequence 0 has a padded third token


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# ------------------------------------------------------------------------------ GSPO's ratio
def test_sequence_ratio_is_the_geometric_mean_over_the_completion_tokens():
    # seq 0: ratios 2 and 0.5 (the padded 99 ignored) -> exp((ln 2 + ln 0.5) / 2) = 1
    # seq 1: ratios 1.5, 1.5, 1.5 -> 1.5
    logps = torch.tensor([[math.log(2), math.log(0.5), 99.0], [math.log(1.5)] * 3])
    ratio = sequence_log_ratio(logps, torch.zeros(2, 3), MASK).exp()
    torch.testing.assert_close(ratio, torch.tensor([[1.0] * 3, [1.5] * 3]))


def test_sequence_ratio_gradient_reaches_every_token_through_the_mean():
    # d/dlogp_t of -r_seq * A with r_seq = exp(mean_t logp_t): -A * r_seq / n on each of the n tokens
    logps = torch.tensor([[math.log(2), math.log(0.5), 5.0]], requires_grad=True)
    objective = PolicyObjective(importance_sampling_level="sequence", epsilon=10.0)
    out = policy_surrogate(logps, torch.zeros(1, 3), torch.tensor([2.0]), MASK[:1], objective)
    (out.loss * MASK[:1]).sum().backward()  # two tokens of loss -2 * 1 each
    torch.testing.assert_close(logps.grad, torch.tensor([[-2.0, -2.0, 0.0]]))  # 2 tokens x (-2 * 1 / 2)


def test_one_sequence_is_clipped_as_a_whole():
    # ratio 1.5 for the sequence: above 1 + 0.2 with A > 0 -> every token held, no gradient
    logps = torch.tensor([[math.log(1.5)] * 3], requires_grad=True)
    out = policy_surrogate(
        logps, torch.zeros(1, 3), torch.tensor([1.0]), MASK[1:], PolicyObjective(importance_sampling_level="sequence")
    )
    assert out.held.all()
    torch.testing.assert_close(out.loss, torch.full((1, 3), -1.2))
    out.loss.sum().backward()
    assert torch.equal(logps.grad, torch.zeros(1, 3))


# ------------------------------------------------------------------------------ two-sided clipping
def test_delta_caps_a_negative_advantages_unclipped_ratio():
    # A = -1, r = 3, clip range [0.8, 1.2]: without delta -min(-3, -1.2) = 3 with gradient -A * r = 3;
    # delta 2: -min(-2, -1.2) = 2, constant, held.
    def run(delta):
        logps = torch.tensor([[math.log(3.0)]], requires_grad=True)
        out = policy_surrogate(
            logps,
            torch.zeros(1, 1),
            torch.tensor([-1.0]),
            torch.ones(1, 1, dtype=torch.bool),
            PolicyObjective(delta=delta),
        )
        out.loss.sum().backward()
        return out.loss.item(), logps.grad.item(), out.held.item()

    assert run(None) == pytest.approx((3.0, 3.0, False))
    assert run(2.0) == pytest.approx((2.0, 0.0, True))


# ------------------------------------------------------------------------------ CISPO
def test_cispo_by_hand():
    # r = (2, 0.5), A = 1, cap 1 + 0.5: weights sg(1.5), sg(0.5); loss -w * A * logp with
    # logp = (ln 2, ln 0.5): (-1.5 ln 2, 0.5 ln 2); gradient -w * A = (-1.5, -0.5); the first capped.
    logps = torch.tensor([[math.log(2.0), math.log(0.5)]], requires_grad=True)
    objective = PolicyObjective(policy_loss="cispo", epsilon_high=0.5)
    out = policy_surrogate(logps, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), objective)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.5 * math.log(2), 0.5 * math.log(2)]]))
    assert out.held.tolist() == [[True, False]]
    out.loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.5, -0.5]]))


# ------------------------------------------------------------------------------ SAPO
def test_sapo_by_hand():
    # token 0: A = +1, r = 1.5, tau 1: s = sigmoid(0.5); loss -4 s; gradient -4 s (1 - s) * 1.5
    # token 1: A = -1, r = 0.5, tau 1.05: s = sigmoid(-0.525); loss (4 / 1.05) s; gradient 4 s (1 - s) * 0.5
    logps = torch.tensor([[math.log(1.5)], [math.log(0.5)]], requires_grad=True)
    objective = PolicyObjective(policy_loss="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)
    out = policy_surrogate(
        logps, torch.zeros(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1, dtype=torch.bool), objective
    )
    s0, s1 = sigmoid(0.5), sigmoid(-0.525)
    torch.testing.assert_close(out.loss, torch.tensor([[-4 * s0], [4 / 1.05 * s1]]))
    out.loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-4 * s0 * (1 - s0) * 1.5], [4 * s1 * (1 - s1) * 0.5]]))
    # gradient weights 4 s (1 - s) r: 1.41, and 0.47 (below 1/2: held)
    assert out.held.tolist() == [[False], [True]]


@pytest.mark.parametrize("level", sorted(IMPORTANCE_SAMPLING_LEVELS))
@pytest.mark.parametrize("policy_loss", sorted(POLICY_LOSSES))
def test_every_surrogate_is_the_plain_policy_gradient_at_ratio_one(policy_loss, level):
    """Without old log-probs (one optimizer step, the sampler is the learner) r = 1: the
    gradient is -A * weight on every completion token, whatever the surrogate and level."""
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    weights = token_weights(MASK.sum(dim=1), "dapo", 4)  # 1 / 5 tokens
    objective = PolicyObjective(policy_loss=policy_loss, importance_sampling_level=level)
    out = policy_gradient_loss(logps, torch.tensor([2.0, -1.0]), MASK, weights, objective=objective)
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]]))
    assert out.clip_fraction.item() == 0.0


def test_the_default_objective_is_the_clip_formula_bit_for_bit():
    """Today's runs keep their numbers: the default surrogate computes exactly the clipped
    formula as written before the toolbox (same operations, same order)."""
    gen = torch.Generator().manual_seed(0)
    logps, old = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    advantages, mask = torch.randn(4, generator=gen), torch.rand(4, 6, generator=gen) > 0.3
    ratio = torch.exp(logps - old)
    adv = advantages.unsqueeze(1)
    expected = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - 0.2, 1 + 0.28) * adv)
    got = policy_surrogate(logps, old, advantages, mask, PolicyObjective(epsilon_high=0.28))
    assert torch.equal(got.loss, expected)


def test_unknown_names_list_the_valid_ones():
    args = (torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"policy_loss='ppo'; expected one of \['cispo', 'clip', 'sapo'\]"):
        policy_surrogate(*args, PolicyObjective(policy_loss="ppo"))
    with pytest.raises(ValueError, match=r"importance_sampling_level='seq'; expected one of \['sequence', 'token'\]"):
        policy_surrogate(*args, PolicyObjective(importance_sampling_level="seq"))
    with pytest.raises(ValueError, match=r"sampler_correction='token'; expected one of \['token_truncate'"):
        sampler_importance_weights(args[0], args[1], args[3], SamplerCorrection("token"))


# ------------------------------------------------------------------------------ sampler corrections
# behaviour - sampler per token: seq 0: (0.5, -1.0, padding), seq 1: (0, 0, 1.5)
BEHAVIOUR = torch.tensor([[-1.0, -2.0, 99.0], [-1.0, -1.0, -1.0]])
SAMPLER = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -2.5]])
E = math.exp
SAMPLER_CASES = {
    # per token, min(w, 1.5): e^0.5 = 1.65 and e^1.5 = 4.48 are capped
    "token_truncate": ([[1.5, E(-1.0)], [1.0, 1.0, 1.5]], [[True, False], [False, False, True]]),
    # per token, w inside [0.5, 1.5]: e^0.5 above, e^-1 = 0.37 below, e^1.5 above
    "token_mask": ([[0.0, 0.0], [1.0, 1.0, 0.0]], [[True, True], [False, False, True]]),
    # per sequence, the product: seq 0 e^(0.5 - 1) = 0.61, seq 1 e^1.5 = 4.48 -> capped at 1.5
    "sequence_truncate": ([[E(-0.5)] * 2, [1.5] * 3], [[False, False], [True] * 3]),
    # per sequence inside [0.5, 1.5]: seq 0 kept whole, seq 1 dropped whole
    "sequence_mask": ([[E(-0.5)] * 2, [0.0] * 3], [[False, False], [True] * 3]),
}


@pytest.mark.parametrize("mode", SAMPLER_CORRECTIONS)
def test_sampler_corrections_by_hand(mode):
    weights, corrected = sampler_importance_weights(BEHAVIOUR, SAMPLER, MASK, SamplerCorrection(mode, 1.5, 0.5))
    expected_weights, expected_corrected = SAMPLER_CASES[mode]
    # the padded token of sequence 0 is left out (the loss masks it)
    torch.testing.assert_close(weights[0, :2], torch.tensor(expected_weights[0]))
    torch.testing.assert_close(weights[1], torch.tensor(expected_weights[1]))
    assert corrected[0, :2].tolist() == expected_corrected[0] and corrected[1].tolist() == expected_corrected[1]


def test_a_sequence_weight_that_overflows_is_capped_or_dropped_not_nan():
    behaviour, sampler, mask = torch.zeros(1, 10), torch.full((1, 10), -100.0), torch.ones(1, 10, dtype=torch.bool)
    truncated, _ = sampler_importance_weights(behaviour, sampler, mask, SamplerCorrection("sequence_truncate", 3.0))
    masked, dropped = sampler_importance_weights(behaviour, sampler, mask, SamplerCorrection("sequence_mask", 3.0))
    assert torch.equal(truncated, torch.full((1, 10), 3.0))
    assert torch.equal(masked, torch.zeros(1, 10)) and dropped.all()


# ------------------------------------------------------------------------------ top-entropy tokens
def test_top_entropy_mask_by_hand():
    # completion entropies 3, 1 | 2, 4, 0.5 (the padded 9 is not ranked); the 0.6 quantile of
    # (0.5, 1, 2, 3, 4) is 2 + 0.4 * (3 - 2) = 2.4: the tokens of entropy 3 and 4 are kept
    entropy = torch.tensor([[3.0, 1.0, 9.0], [2.0, 4.0, 0.5]])
    kept, threshold = top_entropy_mask(entropy, MASK, 0.4)
    assert kept.tolist() == [[True, False, False], [False, True, False]]
    assert threshold.item() == pytest.approx(2.4)
    everything, _ = top_entropy_mask(entropy, MASK, 1.0)
    assert torch.equal(everything, MASK)


def test_only_the_kept_tokens_carry_the_policy_gradient():
    # A = 1, dapo over 5 tokens: kept tokens get -1/5, the others 0 (normalisation unchanged)
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    entropy = torch.tensor([[3.0, 1.0, 9.0], [2.0, 4.0, 0.5]])
    weights = token_weights(MASK.sum(dim=1), "dapo", 4)
    terms = micro_batch_policy_terms(logps, torch.ones(2), MASK, weights, entropy=entropy, top_entropy_quantile=0.4)
    terms.loss.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.2, 0.0, 0.0], [0.0, -0.2, 0.0]]))
    assert terms.entropy_kept.item() == 2 and terms.entropy_threshold.item() == pytest.approx(2.4)


def test_the_quantile_needs_the_entropies():
    with pytest.raises(ValueError, match="top_entropy_quantile < 1 needs the entropy"):
        micro_batch_policy_terms(
            torch.zeros(1, 1),
            torch.ones(1),
            torch.ones(1, 1, dtype=torch.bool),
            torch.ones(1),
            top_entropy_quantile=0.5,
        )


# ------------------------------------------------------------------------------ through a MAGRPO run
# name: (what both runs set, the setting under test, the metric it logs)
SETTINGS = {
    "gspo": ({"epsilon": 3e-4, "epsilon_high": 4e-4}, {"importance_sampling_level": "sequence"}, "clip_fraction"),
    "cispo": ({"epsilon_high": 1e-3}, {"policy_loss": "cispo"}, "clip_fraction"),
    "sapo": ({}, {"policy_loss": "sapo", "sapo_temperature_neg": 2.0}, "clip_fraction"),
    "delta": ({"epsilon": 1e-3}, {"delta": 1.002}, "clip_fraction"),
    "entropy": ({}, {"top_entropy_quantile": 0.5}, "entropy_threshold"),
    "sequence_mask": (
        {"precision": "bf16"},
        {"sampler_correction": "sequence_mask", "sampler_ratio_floor": 0.5},
        "sampler_ratio_masked",
    ),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_setting_trains_and_logs_in_a_seeded_magrpo_run(tmp_path, name):
    """Two optimizer steps per rollout (the ratio leaves 1 on the second): the setting changes
    the trained weights against the same run without it, and its metric is logged for every agent."""
    shared, setting, metric = SETTINGS[name]
    runs = {}
    for label, extra in {"without": shared, name: {**shared, **setting}}.items():
        torch.manual_seed(0)
        trainer = make_trainer(tmp_path / label, args=small_config(tmp_path / label, seed=3, num_iterations=2, **extra))
        trainer.train()
        runs[label] = trainer
    assert not unchanged(snapshot(runs["without"].agents), runs[name].agents), f"{name} changed nothing"
    logged = (tmp_path / name / "run" / "metrics.jsonl").read_text()
    for agent in range(2):
        assert f'"agent{agent}/{metric}"' in logged


def test_truncated_completions_carry_no_gradient(tmp_path):
    """Every completion of the tiny model runs to max_new_tokens: masked, the update has nothing to train."""
    never_ends = {"generation_kwargs": {"min_new_tokens": 6}, "weight_decay": 0.0}  # max_new_tokens is 6
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, mask_truncated_completions=True, **never_ends))
    before = snapshot(trainer.agents)
    trainer.train()
    assert unchanged(before, trainer.agents)
    trained = make_trainer(tmp_path / "plain", args=small_config(tmp_path / "plain", **never_ends))
    before = snapshot(trained.agents)
    trained.train()
    assert not unchanged(before, trained.agents)
