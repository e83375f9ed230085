"""What the families' configs tell a comlrl 1.4.3 user whose setting means something else here:
the words live in compat; each config calls the function for its field."""

from __future__ import annotations


def actor_critic_renamed_advice(
    old_name: str, value: object, gae_lambda: float, num_generations: int, num_turns: int, train_batch_size: object
) -> str | None:
    """1.4.3's ``rollout_buffer_size`` counted samples, and its ``discount`` came with a one-step
    target: the plain rename would change what either meant, so the warning says what to write
    for 1.4.3's meaning (None: the plain rename keeps it)."""
    if old_name == "rollout_buffer_size":
        return buffer_advice(value, num_generations, num_turns, train_batch_size)
    if old_name == "discount" and gae_lambda != 0:
        return (
            f"write gamma={value!r} and gae_lambda=0: 1.4.3's critic target (and advantage) was the one-step "
            f"r + discount * V(next turn), which is gae_lambda=0 here; gae_lambda={gae_lambda!r} mixes in "
            "the Monte-Carlo return (only matters with num_turns > 1)"
        )
    return None


def buffer_advice(size: object, generations: int, turns: int, minibatch: object) -> str | None:
    """1.4.3's actor-critic buffer held ``rollout_buffer_size`` samples per agent (each dataset
    row adds num_generations x num_turns) and its ``train_batch_size`` counted the samples of one
    turn; here both count dataset rows. None where the two units agree."""
    if not all(isinstance(n, int) and n >= 1 for n in (size, generations, turns)) or generations * turns == 1:
        return None
    per_row = generations * turns
    advice = (
        f"1.4.3 counted samples per agent (num_generations={generations} x num_turns={turns} per dataset row), "
        f"here it counts dataset rows: rollout_buffer_size={size} is taken as {size} rows ({size * per_row} "
        f"samples per agent and step); for 1.4.3's buffer write per_device_train_batch_size="
        f"{max(1, size // per_row)} (rollout_buffer_size // {per_row}, about: ended branches add fewer)"
    )
    if isinstance(minibatch, int) and minibatch >= 1 and generations > 1:
        advice += (
            f"; train_batch_size too counted samples (of one turn) there and counts rows here: for 1.4.3's "
            f"minibatches write train_batch_size={max(1, minibatch // generations)}"
        )
    return advice


def heads_learning_rate_message(rate: object, layout: str) -> str:
    """Why ``critic_learning_rate`` does nothing with value heads on the agents (``layout``)."""
    return (
        f"critic_learning_rate={rate!r} has no effect with value heads on the agents ({layout}): the heads "
        "train with their agent at agent_learning_rate, as in comlrl 1.4.3; drop critic_learning_rate (set "
        "agent_learning_rate for both), or give separate critics (critic_model=... or critics=[...])"
    )


def discount_meaning(config_name: str, discount: float) -> str:
    """MAGRPO's ``discount`` below 1 over several turns: applied here, ignored by 1.4.3."""
    return (
        f"{config_name}: discount={discount!r} discounts each next turn's return here; comlrl "
        "1.4.3 ignored discount (undiscounted returns): for its meaning write discount=1.0"
    )


REFERENCE_KL_ON_PAIRS = (
    "there are no rewards to shape while training on pairs (comlrl 1.4.3 ignored it "
    "too); for a reference policy in the DPO loss set dpo_reference='initial'"
)
"""Why MADPO refuses ``reference_kl_enabled``."""
