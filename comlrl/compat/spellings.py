"""comlrl 1.4.3's spellings of the choice fields' values: one table per field, mapping every
spelling 1.4.3 accepted (in lower case) to the value it is here, for the configs to read with
:func:`~comlrl.utils.config_fields.respell` before checking a field's value against their
choices (the shared fields' tables are the engine config's)."""

from __future__ import annotations

CRITIC_TYPE_SPELLINGS = {None: "v", "v": "v", "q": "q"}
"""Every ``critic_type`` comlrl 1.4.3 accepted (any letter case; ``None`` meant ``v``), and what it is here."""

RL_ALGORITHM_ALIASES = {"mareforce": "mareinforce"}
"""comlrl 1.4.3's other spellings of ``rl_algorithm``."""

COMPARATOR_SPELLINGS = {
    "current": "current",
    "self": "current",
    "online": "current",
    "current_copy": "current_copy",
    "copy": "current_copy",
    "online_copy": "current_copy",
    "current-offload": "current_copy",
    "current_offload": "current_copy",
    "model": "model",
    "external": "model",
    "comparator": "model",
    "reference": "model",
    "ref": "model",
    "history": "history",
    "checkpoint": "history",
    "previous": "history",
    "previous_iteration": "history",
    "api": "api",
    "http": "api",
    "endpoint": "api",
}
"""Every ``comparator_policy`` comlrl 1.4.3 accepted (any letter case), and what it is here."""

GENERATION_MODE_SPELLINGS = {
    "decentralized": "decentralized",
    "decentralised": "decentralized",
    "multi_agent": "decentralized",
    "multi-agent": "decentralized",
    "centralized": "centralized",
    "centralised": "centralized",
    "single_agent": "centralized",
    "single-agent": "centralized",
}
"""Every ``comparator_generation_mode`` comlrl 1.4.3 accepted (any letter case), and what it is here."""

API_FORMAT_SPELLINGS = {
    "generic": "generic",
    "openai_chat": "openai_chat",
    "openai": "openai_chat",
    "chat": "openai_chat",
    "anthropic_messages": "anthropic_messages",
    "anthropic": "anthropic_messages",
    "messages": "anthropic_messages",
    "openai_responses": "openai_responses",
    "responses": "openai_responses",
    "codex": "openai_responses",
}
"""Every ``comparator_api_format`` comlrl 1.4.3 accepted (any letter case), and what it is here."""

REPLAY_MODE_SPELLINGS = {
    "current": "current",
    "latest": "current",
    "new": "current",
    "nearest_k": "nearest_k",
    "recent_k": "nearest_k",
    "last_k": "nearest_k",
    "k": "nearest_k",
    "all_history": "all_history",
    "lambda_decay": "lambda_decay",
    "lambda": "lambda_decay",
    "td_lambda": "lambda_decay",
    "td-lambda": "lambda_decay",
}
"""Every ``preference_replay_mode`` comlrl 1.4.3 accepted (any letter case), and what it is here."""

SCORING_REWARD_SPELLINGS = {
    "task": "task",
    "oracle": "task",
    "environment": "task",
    "env": "task",
    "reward_model": "reward_model",
    "model": "reward_model",
    "learned": "reward_model",
}
"""Every ``preference_scoring_reward`` comlrl 1.4.3 accepted (any letter case), and what it is here."""
