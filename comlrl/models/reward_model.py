"""A joint reward model: one score for a joint action of every agent, learned from preferences.

The model reads one text that shows every agent's prompt and response (comlrl 1.4.3's
layout, :func:`joint_reward_text`), runs a transformer WITHOUT its language-model head (the
base model: a vocabulary-wide logit matrix per position would be computed for nothing), and
maps the final hidden state of the text's last real token to a score with a linear head:

    "Joint multi-agent response\\n\\nAgent 1 prompt:\\n...\\n\\nAgent 1 response:\\n..." (per agent)
    ─tokenize (truncated at max_length)─▶ base model ─hidden state at the last real token─▶
    Linear(hidden, 1) ─▶ score

A folder written by :meth:`JointRewardModel.save` holds the base model (Hugging Face format,
safetensors), its tokenizer, the head (``reward_head.safetensors``) and the settings
(``reward_model.json``); :meth:`JointRewardModel.load` reads it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as transformers_logging

from comlrl.models.folders import check_model_source, load_errors
from comlrl.models.forward import padded_forward_kwargs
from comlrl.models.loading import resolve_tokenizers
from comlrl.models.modes import frozen
from comlrl.models.value import hidden_size

JOINT_HEADER = "Joint multi-agent response"
"""The first line of every reward-model input (comlrl 1.4.3's)."""
HEAD_FILE = "reward_head.safetensors"
"""The score head's weights, in a saved reward model's folder."""
SETTINGS_FILE = "reward_model.json"
"""A saved reward model's settings: what makes the folder a reward model's."""


def joint_reward_text(prompts: Sequence[str], completions: Sequence[str]) -> str:
    """The reward model's input for one joint action: the header, then for each agent i
    (1-based) ``Agent i prompt:`` and ``Agent i response:`` blocks, separated by blank lines."""
    if len(prompts) != len(completions):
        raise ValueError(f"a joint action needs one prompt per completion: got {len(prompts)} and {len(completions)}")
    blocks = [JOINT_HEADER]
    for i, (prompt, completion) in enumerate(zip(prompts, completions), start=1):
        blocks += [f"Agent {i} prompt:\n{prompt}", f"Agent {i} response:\n{completion}"]
    return "\n\n".join(blocks)


def last_real_token(attention_mask: Tensor) -> Tensor:
    """``(B, L) -> (B,)``: the highest position whose attention mask is 1, whichever side the
    padding is on (a row without any real token gives 0)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * attention_mask.bool()).amax(dim=1)


def check_tokenizer_argument(tokenizer: Any) -> None:
    """comlrl 1.4.3's ``JointRewardModel(backbone, freeze_backbone=False)`` took the flag
    second, where the tokenizer goes now: a 1.4.3 call such as ``JointRewardModel(backbone,
    True)`` would otherwise fail deep inside with an unrelated AttributeError."""
    if tokenizer is None or hasattr(tokenizer, "pad_token_id"):
        return
    raise TypeError(
        f"JointRewardModel's second argument is the tokenizer, got {tokenizer!r}: the signature is "
        "JointRewardModel(backbone, tokenizer, freeze_backbone=False, max_length=None) (the older one was "
        "(backbone, freeze_backbone)); write JointRewardModel(backbone, tokenizer, freeze_backbone=...) with "
        "the backbone's tokenizer (or None, loaded from the backbone's name_or_path)"
    )


class JointRewardModel(nn.Module):
    """A transformer's base model plus ``Linear(hidden, 1)`` (with bias) on the final hidden
    state of each input's last real token.

    Args:
        backbone: a Hugging Face model; a causal LM is reduced to its base model
            (``model.base_model``), so its LM head is never run.
        tokenizer: encodes the inputs; given none, it pads with its EOS token (said once).
        freeze_backbone: train the head only.
        max_length: inputs are truncated to this many tokens (the tokenizer's truncation
            side); None: the tokenizer's ``model_max_length``.

    The head is kept in float32 whatever the backbone's dtype, and starts at zero: a fresh
    reward model scores every text 0, preferring nothing. Its bias is not trained (the
    Bradley-Terry loss cannot tell it; it stays at 0, or at the value a saved model holds).
    """

    def __init__(
        self, backbone: nn.Module, tokenizer: Any, freeze_backbone: bool = False, max_length: int | None = None
    ):
        super().__init__()
        check_tokenizer_argument(tokenizer)
        self.backbone = getattr(backbone, "base_model", backbone)
        self.tokenizer = resolve_tokenizers(tokenizer, [self.backbone], role="reward model")[0]
        self.freeze_backbone = freeze_backbone
        self.max_length = max_length
        self.head = nn.Linear(hidden_size(self.backbone), 1).to(self.device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.backbone.requires_grad_(not freeze_backbone)
        # Bradley-Terry sees score differences only: the bias's gradient is 0 but for rounding,
        # which AdamW's normalisation would turn into steps of about the learning rate, shifting
        # every score at random (an RL baseline without a mean, such as REINFORCE's, feels that).
        self.head.bias.requires_grad_(False)

    @classmethod
    def from_pretrained(
        cls,
        source: str,
        freeze_backbone: bool = False,
        max_length: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        device: str | torch.device | None = None,
        argument: str = "reward_model_name",
    ) -> JointRewardModel:
        """A fresh reward model on the base model of ``source`` (a folder or hub id; its LM
        head's weights are not loaded) and its tokenizer, on ``device``. ``argument`` is the
        setting ``source`` came from, named in errors."""
        source = check_model_source(source, argument)
        verbosity = transformers_logging.get_verbosity()
        # A causal LM's checkpoint holds LM-head weights the base model leaves out on purpose;
        # transformers would print them as a table of unexpected keys.
        transformers_logging.set_verbosity_error()
        try:
            with load_errors(source, argument):
                backbone = AutoModel.from_pretrained(source, **(model_kwargs or {}))
                tokenizer = AutoTokenizer.from_pretrained(source)
        finally:
            transformers_logging.set_verbosity(verbosity)
        if device is not None:
            backbone.to(device)
        return cls(backbone, tokenizer, freeze_backbone, max_length)

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """``(B, L)`` token ids and attention mask (padded on either side) -> ``(B,)`` float32 scores."""
        # Positions counted from the mask, so left padding does not shift them (as generate does).
        kwargs = padded_forward_kwargs(self.backbone, attention_mask, logits_to_keep=1)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        hidden = hidden.last_hidden_state  # (B, L, H)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        pooled = hidden[rows, last_real_token(attention_mask)]  # (B, H)
        return self.head(pooled.float()).squeeze(-1)

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """``(B, L)`` ids and attention mask of ``texts`` on the model's device, truncated at ``max_length``."""
        encoded = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return encoded["input_ids"].to(self.device), encoded["attention_mask"].to(self.device)

    def scores(self, texts: Sequence[str]) -> Tensor:
        """``(B,)`` scores of ``texts``, in one forward, with gradient (for fitting)."""
        return self(*self.encode(texts))

    def score_texts(self, texts: Sequence[str], batch_size: int | None = None) -> Tensor:
        """``(B,)`` scores of ``texts`` on the CPU, in eval mode without gradient, ``batch_size``
        texts per forward (None: all at once)."""
        size = batch_size or len(texts)
        with frozen(self):
            return torch.cat([self.scores(texts[first : first + size]).cpu() for first in range(0, len(texts), size)])

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What fitting trains: the head, and the backbone unless it is frozen."""
        return [p for p in self.parameters() if p.requires_grad]

    def as_reward_function(self, batch_size: int | None = None) -> RewardModelFunction:
        """This model as a reward function of comlrl's convention (see :class:`RewardModelFunction`)."""
        return RewardModelFunction(self, batch_size)

    # ----------------------------------------------------------------------------------------
    # saving
    # ----------------------------------------------------------------------------------------
    def save(self, folder: str) -> None:
        """The base model and tokenizer (Hugging Face format), the head and the settings, into ``folder``."""
        os.makedirs(folder, exist_ok=True)
        self.backbone.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, os.path.join(folder, HEAD_FILE))
        settings = {"max_length": self.max_length, "freeze_backbone": self.freeze_backbone}
        with open(os.path.join(folder, SETTINGS_FILE), "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=1)

    @classmethod
    def load(
        cls, folder: str, device: str | torch.device | None = None, model_kwargs: dict[str, Any] | None = None
    ) -> JointRewardModel:
        """The reward model :meth:`save` wrote into ``folder``, on ``device``."""
        if not os.path.isfile(os.path.join(folder, SETTINGS_FILE)):
            raise ValueError(f"{folder} holds no {SETTINGS_FILE}: it is not a folder JointRewardModel.save wrote")
        with open(os.path.join(folder, SETTINGS_FILE), encoding="utf-8") as f:
            settings = json.load(f)
        model = cls.from_pretrained(
            folder,
            freeze_backbone=settings["freeze_backbone"],
            max_length=settings["max_length"],
            model_kwargs=model_kwargs,
            device=device,
            argument="reward model folder",
        )
        model.head.load_state_dict(load_file(os.path.join(folder, HEAD_FILE), device=str(model.device)))
        return model


class RewardModelFunction:
    """A :class:`JointRewardModel` as a reward function of comlrl's convention
    (:mod:`comlrl.rewards.joint_reward`): called with one list of completions per agent and,
    by keyword, ``prompt_history_per_agent`` (each agent's prompt of the joint action is the
    last of its history); returns one raw score per joint action, shared by every agent.

    ``model`` may be set later (MARLHF fits it when training starts, or reads it back from a
    checkpoint): the function scores with the model it holds when called.
    """

    __name__ = "reward_model"  # metrics read reward/reward_model/mean
    reward_call = "batch"  # it scores every joint action of a call, each from its own history

    def __init__(self, model: JointRewardModel | None, batch_size: int | None = None):
        self.model = model
        self.batch_size = batch_size

    def __call__(self, *completions: Sequence[str], prompt_history_per_agent: Sequence[Sequence[list[str]]]) -> list:
        if self.model is None:
            raise RuntimeError("the reward function has no reward model yet (MARLHF fits it when train() starts)")
        texts = [
            joint_reward_text([history[-1] for history in histories], joint)
            for histories, joint in zip(prompt_history_per_agent, zip(*completions))
        ]
        return self.model.score_texts(texts, self.batch_size).tolist()
