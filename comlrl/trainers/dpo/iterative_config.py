"""MADPOIter's config (:class:`MADPOIterConfig`, which MARLHFIter's extends): the rounds, the
comparator, the ``api`` comparator's fields and the replay, each checked when the config is
made. Here, apart from the trainer (:mod:`comlrl.trainers.dpo.iterative`), so that the parts
the rounds are made of (comparators, the ``api`` client, the rounds) can be typed by it.

The ``comparator_api_*`` fields must hold no secret: a literal key, or a credential header in
``comparator_api_headers``, would be written into checkpoints, the W&B config and logs, and is
refused (:func:`secret_problem`); the key is read from the environment variable
``comparator_api_key_env`` each time a request is sent (:mod:`comlrl.trainers.dpo.api_comparator`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar
from urllib import parse as urlparse

from comlrl.compat.spellings import (
    API_FORMAT_SPELLINGS,
    COMPARATOR_SPELLINGS,
    GENERATION_MODE_SPELLINGS,
    REPLAY_MODE_SPELLINGS,
)
from comlrl.engine.config_checks import check_bool, check_choice, check_int
from comlrl.trainers.dpo.api_formats import API_FORMATS
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.pairs import COMPARISON_SELECTIONS
from comlrl.trainers.dpo.replay import REPLAY_MODES
from comlrl.utils.checks import field_default, is_real
from comlrl.utils.config_fields import respell

__all__ = ["MADPOIterConfig"]

COMPARATOR_POLICIES = ("current", "current_copy", "model", "history", "api")
"""The ``comparator_policy`` values (:data:`comlrl.trainers.dpo.comparators.COMPARATORS` builds each)."""

CREDENTIAL_HEADER_WORDS = ("auth", "key", "token", "secret", "password", "cookie")
"""A header (or URL query parameter) whose name holds one of these (any case) carries a credential."""

CREDENTIAL_BODY_WORDS = ("api_key", "apikey", "api-key", "secret", "password", "authorization")
"""A ``comparator_api_extra_body`` name holding one of these carries a credential (not ``token``
or ``key`` alone: ``max_tokens`` and ``prompt_cache_key`` are ordinary request fields)."""

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What an environment variable's name looks like (a key, with its dashes, does not)."""


# ------------------------------------------------------------------------------------------
# the config's secrets
# ------------------------------------------------------------------------------------------
def credential_names(names: Any, words: Sequence[str]) -> list[str]:
    """The names (headers, body fields, query parameters) that hold one of ``words``, any case."""
    return [name for name in names if any(word in str(name).lower() for word in words)]


def secret_problem(config: MADPOIterConfig) -> str | None:
    """Why ``config``'s ``comparator_api_*`` fields would put a secret where the config goes
    (checkpoints, the W&B config, logs), or None. The message quotes no value, only names."""
    instead = (
        "put the key in an environment variable (export MY_API_KEY=...) and set comparator_api_key_env='MY_API_KEY' "
        "(comparator_api_key_header and comparator_api_key_prefix say how it is sent)"
    )
    if config.comparator_api_key not in (None, ""):
        return f"comparator_api_key would be saved with the config in checkpoints, the W&B config and logs: {instead}"
    headers = config.comparator_api_headers
    if isinstance(headers, Mapping) and credential_names(headers, CREDENTIAL_HEADER_WORDS):
        named = credential_names(headers, CREDENTIAL_HEADER_WORDS)
        return f"comparator_api_headers names credential headers {named} (their values are not shown): {instead}"
    body = config.comparator_api_extra_body
    if isinstance(body, Mapping) and credential_names(body, CREDENTIAL_BODY_WORDS):
        named = credential_names(body, CREDENTIAL_BODY_WORDS)
        return f"comparator_api_extra_body names credential fields {named} (their values are not shown): {instead}"
    url = config.comparator_api_url
    if isinstance(url, str):
        parts = urlparse.urlsplit(url)
        named = credential_names(dict(urlparse.parse_qsl(parts.query)), CREDENTIAL_HEADER_WORDS)
        if parts.username or parts.password or named:
            where = f"the query parameters {named}" if named else "a user name or password ('user:pass@')"
            return f"comparator_api_url carries {where} (the address is not shown): {instead}"
    key_env = config.comparator_api_key_env
    if key_env is not None and not (isinstance(key_env, str) and ENV_NAME.fullmatch(key_env)):
        return (
            "comparator_api_key_env must be the NAME of an environment variable (letters, digits and _, such as "
            "'OPENAI_API_KEY'), not the key itself (the value given is not shown, in case it is one)"
        )
    return None


# ------------------------------------------------------------------------------------------
# the config
# ------------------------------------------------------------------------------------------
def check_string(config: Any, name: str, allow_none: bool = False, allow_empty: bool = False) -> None:
    """``config.<name>`` must be a string, non-empty unless ``allow_empty`` (or None when ``allow_none``)."""
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if not (isinstance(value, str) and (value or allow_empty)):
        kind = ("a string" if allow_empty else "a non-empty string") + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclass
class MADPOIterConfig(MADPOConfig):
    """Everything that shapes a MADPOIter run: MADPO's fields (with 1.4.3's MADPOIter defaults),
    the rounds, the comparator and the replay. Every field is checked in ``__post_init__``."""

    num_train_epochs: int = 1
    """DPO passes over each round's training pairs."""
    preference_num_candidates: int = 20
    """Candidates N the current policy samples per prompt and agent each round (at least 2)."""
    preference_pairs_per_sample: int | None = 4
    """Most pairs kept per prompt and round, in ``pair_selection`` order (>= 1); ``None`` keeps all."""
    pair_selection: str = "comparator_reward"
    """Which of a prompt's comparisons become pairs first: ``comparator_reward`` (highest
    comparator reward first, then largest gap), ``reward_gap`` (largest gap first), ``random``
    (seeded by ``seed`` and the round), ``all`` (index order; needs
    ``preference_pairs_per_sample=None``)."""

    # --- rounds -----------------------------------------------------------------------------
    num_iterations: int = 6
    """Rounds: each samples new pairs of the current policy against the comparator, then
    trains on them for ``num_train_epochs`` epochs (>= 1)."""

    # --- the comparator -----------------------------------------------------------------------
    comparator_policy: str = "current"
    """What the current policy's candidates are compared with: ``current`` (the agents
    themselves, sampled from a random stream of their own), ``current_copy`` (a frozen copy
    made at each round's start, on ``comparator_devices``), ``model`` (frozen models loaded
    by name), ``history`` (the policy ``comparator_history_k`` rounds earlier), ``api`` (an
    HTTP endpoint, ``comparator_api_url``). comlrl 1.4.3's spellings (``self``, ``copy``,
    ``reference``, ``previous``, ``http``, ...) are accepted."""
    comparator_num_candidates: int | None = None
    """Candidates M the comparator samples per prompt and agent (>= 1); ``None``: ``preference_num_candidates``."""
    comparator_model_name: str | None = None
    """``model`` comparator: a folder or hub id loaded once and used for every agent."""
    comparator_agents: list[str] | None = None
    """``model`` comparator: one folder or hub id per agent, instead of ``comparator_model_name``."""
    comparator_devices: str | list[str] | None = None
    """Where ``current_copy``, ``model`` and ``history`` comparators live (as ``agent_devices``:
    one device, ``"auto"`` or one per agent); ``None``: each agent's device."""
    comparator_history_k: int | None = None
    """``history`` comparator: how many rounds back it is (>= 1); ``None``: 1."""
    comparator_generation_mode: str = "decentralized"
    """``decentralized``: each comparator model writes its own agent's part; ``centralized``:
    one comparator model writes every agent's part in one answer to a joint prompt (the
    trainer's ``centralized_comparator_adapter``, default tagged, builds it and splits the
    answer), which ``collaboration_mode="centralized"`` sets, as comlrl 1.4.3 did."""
    comparator_centralized_agent_index: int = 0
    """``comparator_generation_mode="centralized"`` with one model per agent: whose comparator
    model (of agent 0, 1, ...) answers the joint prompts."""

    # --- the api comparator (comparator_policy="api"; each field an error with any other policy) --
    comparator_api_url: str | None = None
    """The http(s) address each agent's prompt is POSTed to (required with ``api``)."""
    comparator_api_format: str = "generic"
    """``generic``, ``openai_chat``, ``anthropic_messages`` or ``openai_responses`` (or 1.4.3's spellings)."""
    comparator_api_model: str | None = None
    """The ``model`` field of each request (``None``: not sent)."""
    comparator_api_max_n_per_request: int | None = None
    """Most candidates one ``generic``/``openai_chat`` request asks for (>= 1); ``None``: all at once."""
    comparator_api_timeout: float = 120.0
    """Seconds one request may take (> 0)."""
    comparator_api_headers: dict[str, str] | None = None
    """Extra request headers; credential headers (``Authorization``, names with key/token/secret) are refused."""
    comparator_api_key: str | None = field(default=None, repr=False)
    """Refused (it would be saved in checkpoints, W&B and logs): name its variable in ``comparator_api_key_env``."""
    comparator_api_key_env: str | None = None
    """The environment variable the key is read from at each request (``None``: no key is sent)."""
    comparator_api_key_header: str = "Authorization"
    """The header the key is sent in (``anthropic_messages``: ``Authorization`` means ``x-api-key``)."""
    comparator_api_key_prefix: str = "Bearer"
    """What precedes the key in its header (``anthropic_messages``: ``Bearer`` means none)."""
    comparator_api_response_field: str = "completions"
    """``generic``: the dotted path of the answers in a response (absent: 1.4.3's fallback fields)."""
    comparator_api_extra_body: dict[str, Any] | None = None
    """Fields merged over each request's JSON body (e.g. ``{"stop": ["\\n\\n"]}``)."""

    # --- replay across rounds ------------------------------------------------------------------
    preference_replay_mode: str = "current"
    """Which rounds' pairs a round trains on: ``current`` (its own), ``nearest_k`` (the last
    ``preference_replay_k`` rounds), ``all_history`` (every round so far alike),
    ``lambda_decay`` (round of age a weighted (1-λ)λ^a, the newest at age 0)."""
    preference_replay_k: int | None = None
    """``nearest_k``: how many rounds back, this one included (>= 1)."""
    preference_replay_lambda: float | None = None
    """``lambda_decay``: λ in [0, 1] (1: every round alike, 0: only the newest)."""
    preference_replay_sample_size: int | None = None
    """Pairs a round trains on, drawn from the chosen rounds (not with ``current``; >= 1);
    ``None``: as many as the round made."""
    preference_replay_dir: str | None = None
    """Where each round's pairs are written for reading (``iteration_XXXX.json``, token ids
    included); ``None``: ``output_dir/preference_replay``."""
    log_reward_distribution: bool = False
    """comlrl 1.4.3's per-round reward histograms: 16 bins over ``reward_func.reward_range``
    of the raw rewards (before ``reward_processor``) of the round's candidates and training
    pairs, each side, in ``output_dir/reward_distributions/iteration_XXXX.json`` and as
    ``iter/reward_distribution/*`` metrics. Needs ``reward_func.reward_range = (min, max)``."""
    policy_checkpoint_dir: str | None = None
    """Where the policy of every round is written, as ``save_model`` writes it: ``initial/``
    when a run starts, ``iteration_XXXX/`` when round XXXX ends (numbered from 0, as comlrl
    1.4.3); ``None``: not written (the ``history`` comparator keeps its copies in memory)."""

    pair_selections: ClassVar[dict[str, Any]] = COMPARISON_SELECTIONS
    trainer_name: ClassVar[str] = "MADPOIter"

    def __post_init__(self):
        super().__post_init__()
        check_int(self, "num_iterations")
        self._check_comparator()
        self._check_replay()
        check_bool(self, "log_reward_distribution")

    @property
    def joint_comparator(self) -> bool:
        """One comparator model writes every agent's part for agents that each write their own."""
        return self.comparator_generation_mode == "centralized" and self.collaboration_mode == "decentralized"

    @property
    def uses_adapter(self) -> bool:
        return super().uses_adapter or self.joint_comparator

    @property
    def comparator_candidates(self) -> int:
        """M: ``comparator_num_candidates``, else ``preference_num_candidates``."""
        return (
            self.preference_num_candidates if self.comparator_num_candidates is None else self.comparator_num_candidates
        )

    @property
    def history_k(self) -> int:
        """How many rounds back the ``history`` comparator is."""
        return 1 if self.comparator_history_k is None else self.comparator_history_k

    def _check_comparator(self) -> None:
        respell(self, "comparator_policy", COMPARATOR_SPELLINGS, strip=True)
        policy = self.comparator_policy
        check_choice(self, "comparator_policy", COMPARATOR_POLICIES)
        self._check_api()
        respell(self, "comparator_generation_mode", GENERATION_MODE_SPELLINGS, strip=True)
        check_choice(self, "comparator_generation_mode", ("decentralized", "centralized"))
        if self.collaboration_mode == "centralized":
            # The one model writes every role, and so does its comparator (the original forced this too).
            self.comparator_generation_mode = "centralized"
        check_int(self, "comparator_centralized_agent_index", minimum=0)
        if self.comparator_centralized_agent_index and not self.joint_comparator:
            raise ValueError(
                f"comparator_centralized_agent_index={self.comparator_centralized_agent_index} is only used with "
                "comparator_generation_mode='centralized' and collaboration_mode='decentralized' (one comparator "
                "model answering for every agent)"
            )
        check_int(self, "comparator_num_candidates", allow_none=True)
        named = self.comparator_model_name is not None or self.comparator_agents is not None
        if policy == "model" and not named:
            raise ValueError(
                "comparator_policy='model' needs comparator_model_name (one model for every agent) or "
                "comparator_agents (one per agent)"
            )
        if policy != "model" and named:
            raise ValueError(
                "comparator_model_name and comparator_agents are only used with comparator_policy='model', "
                f"not {policy!r}"
            )
        if self.comparator_model_name is not None and self.comparator_agents is not None:
            raise ValueError("comparator_model_name and comparator_agents both name the comparator: set one")
        agents = self.comparator_agents
        if agents is not None and not (
            isinstance(agents, list | tuple) and agents and all(isinstance(a, str) for a in agents)
        ):
            raise ValueError(f"comparator_agents must be a list of folders or hub ids, got {agents!r}")
        devices = self.comparator_devices
        if not (
            devices is None
            or isinstance(devices, str)
            or (isinstance(devices, list | tuple) and devices and all(isinstance(d, str) for d in devices))
        ):
            raise ValueError(
                "comparator_devices must be None, 'auto', a device name or a list of device names (one per agent), "
                f"got {devices!r}"
            )
        if policy == "current" and devices is not None:
            raise ValueError(
                f"comparator_devices={self.comparator_devices!r}: the 'current' comparator samples with the agents "
                "where they are; use comparator_policy='current_copy' for a copy on other devices"
            )
        if policy == "api" and devices is not None:
            raise ValueError(
                f"comparator_devices={self.comparator_devices!r}: the 'api' comparator samples on its endpoint, "
                "not on a device here; leave comparator_devices=None"
            )
        if policy != "history" and self.comparator_history_k is not None:
            raise ValueError(
                f"comparator_history_k={self.comparator_history_k!r} is only used with comparator_policy='history', "
                f"not {policy!r}"
            )
        check_int(self, "comparator_history_k", allow_none=True)

    def _check_api(self) -> None:
        """The ``comparator_api_*`` fields: no secret among them (checked first, so no error
        quotes one), none set without ``comparator_policy='api'``, each valid with it."""
        problem = secret_problem(self)
        if problem is not None:
            raise ValueError(problem)
        respell(self, "comparator_api_format", API_FORMAT_SPELLINGS, strip=True)
        if self.comparator_policy != "api":
            for spec in fields(self):
                value = getattr(self, spec.name)
                if spec.name.startswith("comparator_api_") and value != field_default(self, spec.name):
                    raise ValueError(
                        f"{spec.name}={value!r} is only used with comparator_policy='api', not "
                        f"{self.comparator_policy!r}"
                    )
            return
        if self.comparator_api_url is None:
            raise ValueError(
                "comparator_policy='api' needs comparator_api_url, the address each prompt is POSTed to "
                "(e.g. 'https://api.openai.com/v1/chat/completions' with comparator_api_format='openai_chat')"
            )
        check_string(self, "comparator_api_url")
        url = self.comparator_api_url
        if not url.lower().startswith(("http://", "https://")):
            raise ValueError(f"comparator_api_url must be an http:// or https:// address, got {url!r}")
        check_choice(self, "comparator_api_format", API_FORMATS)
        check_string(self, "comparator_api_model", allow_none=True)
        check_int(self, "comparator_api_max_n_per_request", allow_none=True)
        timeout = self.comparator_api_timeout
        if not (is_real(timeout) and timeout > 0):
            raise ValueError(f"comparator_api_timeout must be a number of seconds > 0, got {timeout!r}")
        headers = self.comparator_api_headers
        if headers is not None and not (
            isinstance(headers, dict) and all(isinstance(text, str) for text in (*headers, *headers.values()))
        ):
            raise ValueError(f"comparator_api_headers must be None or a dict of names to strings, got {headers!r}")
        check_string(self, "comparator_api_key_header")
        check_string(self, "comparator_api_key_prefix", allow_empty=True)
        check_string(self, "comparator_api_response_field")
        body = self.comparator_api_extra_body
        try:
            if body is not None and not (isinstance(body, dict) and all(isinstance(name, str) for name in body)):
                raise TypeError(f"it is {body!r}")
            json.dumps(body)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"comparator_api_extra_body must be None or a dict of JSON values (it is sent in each request): {error}"
            ) from None

    def _check_replay(self) -> None:
        respell(self, "preference_replay_mode", REPLAY_MODE_SPELLINGS, strip=True)
        mode = self.preference_replay_mode
        check_choice(self, "preference_replay_mode", REPLAY_MODES)
        if mode == "nearest_k" and self.preference_replay_k is None:
            raise ValueError("preference_replay_mode='nearest_k' needs preference_replay_k (how many rounds back)")
        if mode != "nearest_k" and self.preference_replay_k is not None:
            raise ValueError(
                f"preference_replay_k={self.preference_replay_k!r} is only used with preference_replay_mode="
                f"'nearest_k', not {mode!r}"
            )
        check_int(self, "preference_replay_k", allow_none=True)
        decay = self.preference_replay_lambda
        if mode == "lambda_decay" and decay is None:
            raise ValueError("preference_replay_mode='lambda_decay' needs preference_replay_lambda, in [0, 1]")
        if mode != "lambda_decay" and decay is not None:
            raise ValueError(
                f"preference_replay_lambda={decay!r} is only used with preference_replay_mode='lambda_decay', "
                f"not {mode!r}"
            )
        if decay is not None and not (is_real(decay) and 0 <= decay <= 1):
            raise ValueError(f"preference_replay_lambda must be in [0, 1], got {decay!r}")
        if mode == "current" and self.preference_replay_sample_size is not None:
            raise ValueError(
                f"preference_replay_sample_size={self.preference_replay_sample_size!r}: preference_replay_mode="
                "'current' trains on every pair of the round; choose 'nearest_k', 'all_history' or 'lambda_decay' "
                "to draw a sample"
            )
        check_int(self, "preference_replay_sample_size", allow_none=True)
        for name in ("preference_replay_dir", "policy_checkpoint_dir"):
            folder = getattr(self, name)
            if folder is not None and not (isinstance(folder, str) and folder):
                raise ValueError(f"{name} must be None or a folder path, got {folder!r}")
