"""Critics: a value head on a causal LM's last hidden state, read at the last token of a text.

A critic is a backbone (an agent's own model, or a separate causal LM) plus a small head
that maps the final hidden state of the input's last token to one value per output. Inputs
are texts, tokenized by the critic's own tokenizer and left-padded, so the last column is
every row's last token; the language-model head computes one position only.

A head is saved as ``value_head.safetensors``; comlrl 1.4.3's ``value_head.pt`` (the
original head file) is read too, through :mod:`comlrl.compat.actor_critic`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from comlrl.models.forward import padded_forward_kwargs

VALUE_HEAD_FILE = "value_head.safetensors"
"""The file of a value head, in its agent's (or critic's) folder."""


def hidden_size(model: nn.Module) -> int:
    """Width of the model's last hidden state, from its config."""
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not isinstance(size, int):
        raise ValueError(f"cannot put a value head on {type(model).__name__}: its config has no hidden_size or n_embd")
    return size


class HeadFormat(NamedTuple):
    """A value head file of another layout than ours, read beside ours."""

    file: str
    """Its name in a folder."""
    described: str
    """How errors name it."""
    read: Callable[[str, int], dict[str, Tensor]]
    """Its weights under :class:`ValueHead`'s names, from its path and the head's output count."""


OTHER_HEAD_FORMATS: list[HeadFormat] = []
"""Other head files read beside ``value_head.safetensors``, registered by who knows them
(:mod:`comlrl.compat.actor_critic` registers comlrl 1.4.3's ``value_head.pt``)."""


class ValueHead(nn.Module):
    """``hidden -> values``: a linear map, or ``Linear-Tanh-Linear`` with a hidden layer.

    Kept in float32 whatever the backbone's dtype. The output layer starts at zero, so a new
    critic predicts 0 everywhere and the first advantages are the returns themselves.
    """

    def __init__(self, input_size: int, num_values: int = 1, hidden_dim: int | None = None):
        super().__init__()
        layers: list[nn.Module] = []
        if hidden_dim:
            layers += [nn.Linear(input_size, hidden_dim), nn.Tanh()]
        layers.append(nn.Linear(hidden_dim or input_size, num_values))
        self.layers = nn.Sequential(*layers)
        nn.init.zeros_(self.layers[-1].weight)
        nn.init.zeros_(self.layers[-1].bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.layers(hidden.float())

    @property
    def num_values(self) -> int:
        return self.layers[-1].out_features

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, os.path.join(folder, VALUE_HEAD_FILE))

    @property
    def hidden_dim(self) -> int | None:
        """Width of the hidden layer; None for one linear map."""
        return self.layers[0].out_features if len(self.layers) > 1 else None

    def load(self, folder: str, width_setting: str = "hidden_dim") -> None:
        """Load the head saved in ``folder`` (:func:`saved_head_file`). An error names the file
        and what differs; ``width_setting`` is the setting that sizes this head, named when the
        saved one is another width."""
        path = saved_head_file(folder)
        if path is None:
            others = "".join(f", or {other.described}" for other in OTHER_HEAD_FORMATS)
            raise ValueError(
                f"{folder} holds no value head ({VALUE_HEAD_FILE}{others}): it was written with another critic layout"
            )
        weights = read_head_weights(path, self.num_values)
        saved_width = weights["layers.0.weight"].shape[0] if "layers.2.weight" in weights else None
        if saved_width != self.hidden_dim:
            raise ValueError(
                f"{path} holds a value head with hidden width {saved_width}, this one has {self.hidden_dim}: "
                f"set {width_setting}={saved_width!r}"
            )
        try:
            self.load_state_dict(weights)
        except RuntimeError as error:
            raise ValueError(f"{path} does not fit this value head: {error}") from error


def saved_head_file(folder: str) -> str | None:
    """The value head file in ``folder`` (ours, or one of ``OTHER_HEAD_FORMATS``), None when
    there is none; a folder with two is an error, since which one is meant is unknowable."""
    names = [VALUE_HEAD_FILE] + [other.file for other in OTHER_HEAD_FORMATS]
    found = [os.path.join(folder, name) for name in names if os.path.isfile(os.path.join(folder, name))]
    if len(found) > 1:
        raise ValueError(f"{folder} holds two value heads ({' and '.join(map(os.path.basename, found))}): keep one")
    return found[0] if found else None


def read_head_weights(path: str, num_values: int) -> dict[str, Tensor]:
    """The weights of a saved head file under :class:`ValueHead`'s names."""
    formats = [HeadFormat(VALUE_HEAD_FILE, VALUE_HEAD_FILE, read_our_head), *OTHER_HEAD_FORMATS]
    read = next(other.read for other in formats if os.path.basename(path) == other.file)
    return read(path, num_values)


def read_our_head(path: str, num_values: int) -> dict[str, Tensor]:
    """The weights of a ``value_head.safetensors``."""
    try:
        return load_file(path)
    except Exception as error:
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error})") from error


def last_token_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``(S, H)`` final hidden state at the last column of left-padded inputs."""
    kwargs = padded_forward_kwargs(model, attention_mask, logits_to_keep=1)
    outputs = model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False, **kwargs
    )
    return outputs.hidden_states[-1][:, -1]


@dataclass
class EncodedInputs:
    """A critic's inputs, tokenized once per step and cut into micro-batches later."""

    input_ids: Tensor
    """``(S, L)`` left-padded."""
    attention_mask: Tensor

    def rows(self, rows: slice) -> tuple[Tensor, Tensor]:
        """The rows ``rows``, without the columns that are padding in all of them."""
        ids, mask = self.input_ids[rows], self.attention_mask[rows]
        kept = mask.bool().any(dim=0).nonzero()
        first = kept[0].item() if len(kept) else 0
        return ids[:, first:], mask[:, first:]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class Critic:
    """A backbone, its value head and the tokenizer of its inputs."""

    name: str
    """``critic {c}``, for errors and metrics."""
    backbone: nn.Module
    head: ValueHead
    tokenizer: Any
    agent: int | None = None
    """Index of the agent whose model is the backbone (a value head on the agent), or None
    for a separate critic model."""

    @property
    def width_setting(self) -> str:
        """The config field that sizes this critic's value head."""
        return "value_head_hidden_dim" if self.agent is not None else "critic_value_head_hidden_dim"

    def use_head(self, head: ValueHead) -> None:
        """Predict with ``head`` from now on (a value head given with the agent, checked to fit)."""
        self.head = head

    def parameters(self) -> list[nn.Parameter]:
        """What the critic's optimizer trains: the head, and a separate backbone's weights (the
        shared backbone of a value head on an agent is trained by that agent's optimizer, and
        the head at that agent's learning rate)."""
        own = [] if self.agent is not None else [p for p in self.backbone.parameters() if p.requires_grad]
        return list(self.head.parameters()) + own

    def max_length(self) -> int | None:
        """The most tokens the backbone's positions allow, when its config says."""
        config = getattr(self.backbone, "config", None)
        lengths = [getattr(config, "max_position_embeddings", None), getattr(config, "n_positions", None)]
        lengths = [n for n in lengths if isinstance(n, int)]
        return min(lengths) if lengths else None

    def encode(self, texts: Sequence[str], describe: Any) -> EncodedInputs:
        """Tokenize ``texts`` (left-padded); ``describe(k)`` names input k in errors: an input
        that encodes to nothing, is too long for the backbone, or (for a separate critic) holds
        what its tokenizer cannot encode."""
        encoded = self.tokenizer(list(texts), return_tensors="pt", padding=True, padding_side="left")
        mask = encoded["attention_mask"]
        lengths = mask.sum(dim=1).tolist()
        limit = self.max_length()
        # A value head on an agent reads what that agent was prompted with, however it encodes it.
        unknown = getattr(self.tokenizer, "unk_token_id", None) if self.agent is None else None
        for k, length in enumerate(lengths):
            problem = None
            if length == 0:
                problem = "encodes to no tokens"
            elif limit is not None and length > limit:
                problem = f"is {length} tokens long, above the {limit} positions of the critic's model"
            elif unknown is not None and bool((encoded["input_ids"][k][mask[k].bool()] == unknown).any()):
                problem = "holds characters its tokenizer cannot encode (unknown tokens)"
            if problem:
                raise ValueError(f"{self.name}'s input for {describe(k)} {problem}: {texts[k][:200]!r}")
        device = next(self.backbone.parameters()).device
        return EncodedInputs(encoded["input_ids"].to(device), mask.to(device))

    def values(self, inputs: EncodedInputs, rows: slice) -> Tensor:
        """``(rows, num_values)`` values of the inputs ``rows``, in float32."""
        return self.head(last_token_hidden(self.backbone, *inputs.rows(rows)))
