"""The ``api`` comparator: each agent's prompt POSTed to an HTTP endpoint, which answers with
the comparator's candidates as text (comlrl 1.4.3's ``comparator_policy="api"``, its fields,
formats and key rule). What a request holds and where its answers are, for each
``comparator_api_format``, is in ``api_formats.py``; this module sends the requests and keeps
the key out of everything saved.

Requests are sent again until every prompt has its candidates, so an endpoint that answers
fewer than asked (DeepSeek ignores ``n``) still serves; a response with none is an error.

The key never enters the config: it is read from the environment variable
``comparator_api_key_env`` each time a request is sent, kept nowhere, and scrubbed from every
error message. A literal key, or a credential header in ``comparator_api_headers``, would be
written into checkpoints, the W&B config and logs, and is refused when the config is made
(:func:`comlrl.trainers.dpo.iterative_config.secret_problem`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any
from urllib import error as urlerror
from urllib import request as urlrequest

import torch

from comlrl.engine.agents import Agents
from comlrl.rollout.generation import AgentRollout, rollout_from_texts
from comlrl.rollout.prompt_fit import check_encodable
from comlrl.trainers.dpo.api_formats import API_FORMATS, ApiFormat, ComparatorApiError, api_sampling, excerpt
from comlrl.trainers.dpo.iterative_config import MADPOIterConfig


# ------------------------------------------------------------------------------------------
# the key
# ------------------------------------------------------------------------------------------
def read_key(key_env: str | None) -> str | None:
    """The key in the environment variable ``key_env`` (None: the endpoint takes no key), read
    at each request and never kept, so that nothing the trainer saves can hold it."""
    if key_env is None:
        return None
    key = os.environ.get(key_env)
    if not key:
        raise ValueError(
            f"comparator_api_key_env={key_env!r}: the environment variable {key_env} is not set (or is empty); "
            f"export {key_env}=<your API key> before training, or set comparator_api_key_env=None for an endpoint "
            "that takes no key"
        )
    return key


def scrubbed(text: str, key: str | None) -> str:
    """``text`` (an error body, a reason) with the key cut out: providers echo a bad key back."""
    return text.replace(key, "<comparator_api_key_env's key>") if key else text


# ------------------------------------------------------------------------------------------
# the client: requests until every candidate is there
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ApiClient:
    """The endpoint as the config describes it (no key: the key stays in the environment)."""

    url: str
    api_format: str
    model: str | None
    max_n_per_request: int | None
    timeout: float
    headers: dict[str, str]
    key_env: str | None
    key_header: str
    key_prefix: str
    response_field: str
    extra_body: dict[str, Any]

    @classmethod
    def from_config(cls, args: MADPOIterConfig) -> ApiClient:
        """The endpoint of a checked MADPOIter / MARLHFIter config with ``comparator_policy='api'``."""
        return cls(
            url=args.comparator_api_url,
            api_format=args.comparator_api_format,
            model=args.comparator_api_model,
            max_n_per_request=args.comparator_api_max_n_per_request,
            timeout=float(args.comparator_api_timeout),
            headers=dict(args.comparator_api_headers or {}),
            key_env=args.comparator_api_key_env,
            key_header=args.comparator_api_key_header,
            key_prefix=args.comparator_api_key_prefix,
            response_field=args.comparator_api_response_field,
            extra_body=dict(args.comparator_api_extra_body or {}),
        )

    @property
    def format(self) -> ApiFormat:
        return API_FORMATS[self.api_format]

    def request_headers(self, key: str | None) -> dict[str, str]:
        """JSON content, the format's headers, the user's, then the key (1.4.3's rule: the
        Anthropic format sends it in ``x-api-key``, without a ``Bearer`` prefix)."""
        headers = {"Content-Type": "application/json", **self.format.headers, **self.headers}
        if key is None:
            return headers
        header, prefix = self.key_header, self.key_prefix.strip()
        if self.format.bare_key_header is not None:
            header = self.format.bare_key_header if header.lower() == "authorization" else header
            prefix = "" if prefix.lower() == "bearer" else prefix
        return {**headers, header: f"{prefix} {key}" if prefix else key}

    def post(self, payload: dict[str, Any]) -> Any:
        """The parsed JSON answer to one request. A failure is raised with the key cut out of
        its message and without the urllib error it replaces (whose request holds the key)."""
        key = read_key(self.key_env)
        data = json.dumps(payload).encode("utf-8")
        request = urlrequest.Request(self.url, data=data, headers=self.request_headers(key), method="POST")
        try:
            with urlrequest.urlopen(request, timeout=self.timeout) as response:
                body = response.read().decode("utf-8", errors="replace")
        except (OSError, HTTPException) as error:  # URLError, HTTPError, timeouts, dropped connections
            raise ComparatorApiError(scrubbed(self.failure(error), key)) from None
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            message = f"{self.url} answered with a body that is not JSON: {excerpt(body)}"
            raise ComparatorApiError(scrubbed(message, key)) from None

    def failure(self, error: Exception) -> str:
        """What a failed request says: the HTTP status and the body's start (1.4.3's message
        for 402, an empty balance), the timeout, or why the endpoint could not be reached."""
        if isinstance(error, urlerror.HTTPError):
            detail = excerpt(error.read().decode("utf-8", errors="replace"))
            if error.code == 402:
                return f"{self.url} answered HTTP 402: insufficient balance; top up the account. The answer: {detail}"
            return f"{self.url} answered HTTP {error.code}: {detail}"
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            return f"{self.url} did not answer within comparator_api_timeout={self.timeout}s"
        return f"{self.url} could not be reached: {reason}"

    def ask(self, prompt: str, agent: int, count: int, settings: dict[str, Any]) -> list[str]:
        """The answers of one request for ``count`` candidates (``extra_body`` merged over the format's fields)."""
        payload = {**self.format.payload(prompt, agent, count, settings, self.model), **self.extra_body}
        return self.format.texts(self.post(payload), self.response_field)

    def per_request(self, remaining: int) -> int:
        """How many candidates the next request asks for."""
        if self.format.one_per_request:
            return 1
        return min(remaining, self.max_n_per_request or remaining)

    def completions(self, prompt: str, agent: int, index: int, count: int, sampling: Mapping[str, Any]) -> list[str]:
        """``count`` answers to agent ``agent``'s prompt ``index`` (of the batch being sampled):
        requests are sent until there are as many (an endpoint may answer fewer than asked);
        one that answers none, or fails, is an error naming the agent and the prompt."""
        settings = api_sampling(sampling)
        where = f"the comparator API, asked for agent {agent}'s prompt {index} ({excerpt(prompt)[:60]!r})"
        texts: list[str] = []
        while len(texts) < count:
            asked = self.per_request(count - len(texts))
            try:
                answers = self.ask(prompt, agent, asked, settings)
            except ComparatorApiError as error:
                raise ComparatorApiError(f"{where}: {error}") from None
            if not answers:
                raise ComparatorApiError(
                    f"{where}, answered no completion to a request for {asked} ({len(texts)} of the {count} "
                    f"candidates came before it); check comparator_api_format={self.api_format!r}"
                    + (" and comparator_api_response_field" if self.api_format == "generic" else "")
                )
            for answer in answers[:asked]:  # a JSON "\ud800" escape decodes to a lone surrogate
                check_encodable(answer, f"answer {len(texts)} of {where}")
                texts.append(answer)
        return texts


# ------------------------------------------------------------------------------------------
# the generation backend
# ------------------------------------------------------------------------------------------
class ApiBackend:
    """A generation backend whose completions come from the comparator's endpoint.

    The endpoint answers text; each answer is tokenized with the agent's tokenizer (no special
    tokens added) and the agent's EOS is appended, so the comparator's candidates end as the
    agents' sampled ones do and a pair's two sides are scored, masked and trained on alike
    (the DPO step, the reward model). Answers are cut to ``max_new_tokens`` tokens (the cut
    ones end without EOS, marked truncated), and their texts are decoded from those tokens,
    so the reward scores exactly what the pair holds.

    It draws nothing from torch's generators: the endpoint's randomness is its own, so a
    round's comparator candidates are not reproducible (a checkpoint keeps the round's pairs).
    """

    def __init__(self, client: ApiClient, agents: Agents):
        self.client, self.agents = client, agents
        read_key(client.key_env)  # an unset variable fails now, not after round 1's own sampling

    def generate(
        self,
        agent: int,
        prompts: list[str],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        texts = [
            text
            for index, prompt in enumerate(prompts)
            for text in self.client.completions(prompt, agent, index, num_generations, sampling)
        ]
        return rollout_from_texts(self.agents, agent, prompts, texts, num_generations, sampling)

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        return True  # no torch randomness: agents may ask in parallel threads

    def sync_weights(self, agent: int) -> None:
        pass  # the endpoint's model does not train
