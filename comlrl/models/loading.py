"""Building the agents and their tokenizers from what the user passed."""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import re
import struct
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import transformers
from huggingface_hub import constants, model_info, try_to_load_from_cache
from huggingface_hub.errors import RepositoryNotFoundError
from safetensors import SafetensorError, safe_open
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoTokenizer

from comlrl.utils.per_agent import per_agent


class ModelConfig(NamedTuple):
    """What a trainer's ``model_config`` says, by destination."""

    model_kwargs: dict[str, Any]
    """``from_pretrained`` keyword arguments of the models."""
    tokenizer_kwargs: dict[str, Any]
    """``from_pretrained`` keyword arguments of the tokenizers loaded by name."""
    special_tokens: dict[str, Any]
    """``add_special_tokens`` argument applied to every agent's tokenizer (see :func:`add_special_tokens`)."""


def split_model_config(model_config: dict[str, Any] | None) -> ModelConfig:
    """``model_config`` by destination.

    Flat keys (``{"dtype": "bfloat16", "attn_implementation": "sdpa"}``) are for the models;
    comlrl 1.4.3's sections are accepted beside them: ``model_kwargs`` (merged over the flat
    keys), ``tokenizer_kwargs`` and ``special_tokens``. A key given flat and in
    ``model_kwargs`` with different values is an error.
    """
    if model_config is not None and not isinstance(model_config, Mapping):
        raise TypeError(f"model_config must be a dict, got {type(model_config).__name__}")
    config = dict(model_config or {})
    sections = {}
    for name in ModelConfig._fields:
        section = config.pop(name, None) or {}
        if not isinstance(section, Mapping):
            raise TypeError(f"model_config[{name!r}] must be a dict, got {type(section).__name__}")
        sections[name] = dict(section)
    clash = sorted(
        key for key in set(config) & set(sections["model_kwargs"]) if config[key] != sections["model_kwargs"][key]
    )
    if clash:
        raise ValueError(f"model_config gives {clash} both flat and in model_kwargs, with different values: keep one")
    sections["model_kwargs"] = {**config, **sections["model_kwargs"]}
    return ModelConfig(**sections)


class TokenizedModel(NamedTuple):
    """A model and the tokenizer it reads with, as :func:`fit_embeddings` checks them."""

    role: str
    """What it is, as errors name it: "agent", "critic"."""
    index: int
    model: torch.nn.Module
    tokenizer: Any
    loaded: bool
    """The trainer loaded it from a folder or hub id, so it may resize it; a model passed in
    as an object is the user's, and is left as it is."""


def embedding_rows(model: torch.nn.Module) -> int:
    return model.get_input_embeddings().weight.shape[0]


def models_to_resize(members: Sequence[TokenizedModel]) -> list[TokenizedModel]:
    """The members whose model has fewer embedding rows than its tokenizer has tokens (every
    one of them loaded by name), or a ValueError naming the culprit.

    Members sharing one tokenizer object are checked together: once it outgrows one of their
    models, their models must have the same number of rows (two vocabularies cannot both be
    one tokenizer's, and a new token id would land on a fresh row in one model and an old row
    in the other), and none of the models it outgrows may have been passed in.
    """
    groups: dict[int, list[TokenizedModel]] = {}
    for member in members:
        groups.setdefault(id(member.tokenizer), []).append(member)
    short: list[TokenizedModel] = []
    for group in groups.values():
        size = len(group[0].tokenizer)
        lacking = [m for m in group if embedding_rows(m.model) < size]
        if not lacking:
            continue
        rows = embedding_rows(lacking[0].model)
        other = next((m for m in group if embedding_rows(m.model) != rows), None)
        if other is not None:
            first, second = sorted((lacking[0], other), key=lambda m: m.index)
            role = first.role
            raise ValueError(
                f"{role}s {first.index} and {second.index} share a tokenizer but have {embedding_rows(first.model)} "
                f"and {embedding_rows(second.model)} embedding rows; model_config's special_tokens grow it to "
                f"{size} tokens, past {role} {lacking[0].index}'s rows, and one tokenizer cannot be grown into two "
                f"vocabularies: give each {role} its own tokenizer (a list with one per {role}, or None to load "
                "each one's own)"
            )
        given = next((m for m in lacking if not m.loaded), None)
        if given is not None:
            raise ValueError(
                f"{given.role} {given.index}'s tokenizer holds {size} tokens with model_config's special_tokens, "
                f"beyond its model's {rows} embedding rows, and that model was passed in as an object, which the "
                "trainer does not change: add the tokens and resize it first (tokenizer.add_special_tokens(...), "
                "then model.resize_token_embeddings(len(tokenizer))), or pass its folder or hub id to have the "
                "trainer load and resize it"
            )
        short += lacking
    return short


def resize_embeddings(model: torch.nn.Module, size: int) -> None:
    """``model.resize_token_embeddings(size)``, as transformers documents it: a tied output head
    grows with the input embeddings, and the new rows of both are drawn close to the mean of
    the old ones. They are drawn under seed 0, the caller's random state left as it was, so
    that every data-parallel rank adds the same rows (frozen ones, under LoRA adapters or in a
    reference, are never broadcast) and a run does not depend on when the tokens were added."""
    device = model.get_input_embeddings().weight.device  # a GPU only under a device_map
    on_gpu = device.type == "cuda"
    with torch.random.fork_rng(devices=[device.index] if on_gpu else []):
        torch.random.default_generator.manual_seed(0)
        if on_gpu:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(0)
        model.resize_token_embeddings(size)


def fit_embeddings(members: Sequence[TokenizedModel]) -> None:
    """Resize the models loaded by name that their tokenizers outgrew to ``len(tokenizer)``
    (:func:`resize_embeddings`). A model shared by several members (one base under adapters)
    is resized once, to the longest of their tokenizers. Everything is checked
    (:func:`models_to_resize`) before any model changes."""
    models: dict[int, torch.nn.Module] = {}
    sizes: dict[int, int] = {}
    for member in models_to_resize(members):
        key = id(member.model)
        models[key] = member.model
        sizes[key] = max(sizes.get(key, 0), len(member.tokenizer))
    for key, size in sizes.items():
        resize_embeddings(models[key], size)


def add_special_tokens(
    tokenizers: Sequence[Any],
    models: Sequence[torch.nn.Module],
    special_tokens: dict[str, Any],
    loaded: Sequence[bool],
) -> None:
    """``tokenizer.add_special_tokens(special_tokens)`` for each distinct tokenizer (as
    comlrl 1.4.3's ``model_config["special_tokens"]``), then the agents' models that
    the trainer loaded (``loaded[i]``) resized to their tokenizers (:func:`fit_embeddings`).
    1.4.3 resized nothing, and failed at the first new token; a model passed in is refused
    here rather than failing so. Call it before adapters are attached (a LoRA wrapper,
    ``modules_to_save`` included, then sees the grown vocabulary) and before references
    are copied."""
    if not special_tokens:
        return
    for tokenizer in {id(t): t for t in tokenizers}.values():
        tokenizer.add_special_tokens(special_tokens)
    fit_embeddings([TokenizedModel("agent", i, *member) for i, member in enumerate(zip(models, tokenizers, loaded))])


# A hub id is ``name`` or ``namespace/name`` (letters, digits, ``-``, ``_``, ``.``); anything else
# can only be a folder on disk.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")


def looks_like_path(value: str) -> bool:
    """True when ``value`` can only mean a folder: absolute, ``.``/``~``-relative, nested, or no hub id."""
    return (
        os.path.isabs(value)
        or value.startswith((".", "~"))
        or value.count(os.sep) > 1
        or HUB_ID.fullmatch(value) is None
    )


# The weight files ``from_pretrained`` reads from a folder (``model-00001-of-00002.safetensors``
# shards and ``model.fp16.safetensors`` variants included).
WEIGHT_FILES = (
    "model*.safetensors",
    "model*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
)


@contextmanager
def read_errors(path: str, value: str, argument: str) -> Iterator[None]:
    """An OSError while reading ``path`` (permissions, a failing disk) re-raised naming ``argument`` and the file."""
    try:
        yield
    except OSError as error:
        raise OSError(
            f"{argument} {value!r}: {path} cannot be read ({error}); check its permissions, or copy the model again"
        ) from error


def read_json(path: str, value: str, argument: str) -> Any:
    """The JSON in ``path``, or a ValueError naming ``argument`` and the file."""
    with read_errors(path, value, argument), open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(
                f"{argument} {value!r}: {path} is not valid JSON ({error}); put back the file saved with the model "
                "(model.save_pretrained(folder) writes it)"
            ) from error


def check_config(folder: str, value: str, argument: str) -> None:
    """config.json must be a JSON object whose ``model_type`` names an architecture this
    transformers knows, or that brings its own code (``auto_map``, for ``trust_remote_code``).
    transformers 5 requires ``model_type`` (4.x guessed it from the folder's name)."""
    path = os.path.join(folder, "config.json")
    config = read_json(path, value, argument)
    if not isinstance(config, dict):
        raise ValueError(
            f"{argument} {value!r}: {path} holds a JSON {type(config).__name__}, not the object of settings "
            "model.save_pretrained(folder) writes; put back the config.json saved with the model"
        )
    model_type = config.get("model_type")
    known = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    if known or "AutoConfig" in (config.get("auto_map") or {}):
        return
    named = f"model_type {model_type!r}" if model_type else "no model_type"
    raise ValueError(
        f"{argument} {value!r}: {path} names {named}, which transformers {transformers.__version__} does not know; "
        "correct model_type (e.g. 'llama', 'qwen2'), or upgrade transformers (pip install -U transformers) if "
        "the model is newer than it"
    )


def declared_size(path: str) -> int | None:
    """The bytes a safetensors file's header says the file holds (8-byte length, header, tensor
    data), or None when the header itself cannot be read."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8).ljust(8, b"\0"))
        if length > os.path.getsize(path):  # cut short inside the header (or not safetensors at all)
            return None
        try:
            header = json.loads(f.read(length))
            ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None
    return 8 + length + max(ends, default=0)


def check_safetensors(path: str, value: str, argument: str) -> None:
    """``path`` must be a whole safetensors file. ``safe_open`` reads only the header, which
    declares every tensor's place, and refuses a file whose size is not what that declares."""
    with read_errors(path, value, argument):
        try:
            with safe_open(path, framework="pt"):
                return
        except SafetensorError as error:
            size, declared = os.path.getsize(path), declared_size(path)
            held = f"holds {size:,} bytes" + (f" of the {declared:,} its header declares" if declared else "")
            raise ValueError(
                f"{argument} {value!r}: {path} {held}, so it is not a complete safetensors file (safetensors: "
                f"{error}); it was likely cut short by an interrupted download or copy: download or copy it again"
            ) from error


def check_weights(folder: str, value: str, argument: str) -> None:
    """The folder must hold weights, every shard its index lists, and whole safetensors files."""
    names = set(os.listdir(folder))
    found = sorted(n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in WEIGHT_FILES))
    if not found:
        raise ValueError(
            f"{argument} {value!r}: {folder} holds config.json but no weights (model.safetensors, "
            "model.safetensors.index.json with its shards, or pytorch_model.bin); copy the weights beside "
            "config.json, or save the model again with model.save_pretrained(folder)"
        )
    safetensors = {n for n in found if n.endswith(".safetensors")}
    for index in (n for n in found if n.endswith(".index.json")):
        path = os.path.join(folder, index)
        contents = read_json(path, value, argument)
        weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(
                f"{argument} {value!r}: {path} has no weight_map naming each tensor's shard; put back the index "
                "saved with the model"
            )
        shards = set(weight_map.values())
        missing = sorted(shard for shard in shards if not os.path.isfile(os.path.join(folder, shard)))
        if missing:
            raise ValueError(
                f"{argument} {value!r}: {path} lists {len(missing)} shard(s) missing from the folder "
                f"({', '.join(missing)}); copy them beside it, or download the model again"
            )
        safetensors |= {n for n in shards if n.endswith(".safetensors")}
    for name in sorted(safetensors):
        check_safetensors(os.path.join(folder, name), value, argument)


def check_model_folder(folder: str, value: str, argument: str) -> None:
    """What ``from_pretrained`` reads from ``folder`` (``value``, as the user wrote it), checked
    before any weights load, cheaply (JSON files and safetensors headers only): a ValueError
    naming ``argument``, the file, what is wrong and what to do, or an OSError for a file that
    cannot be read, with the original error as its cause.

    Without this each fault surfaces many frames down, in transformers' or safetensors' words:
    "does not recognize this architecture", "incomplete metadata, file not fully covered".
    """
    check_config(folder, value, argument)
    check_weights(folder, value, argument)


def check_model_source(value: str, argument: str) -> str:
    """``value`` (a folder or a hub id) as ``from_pretrained`` should get it, or a ValueError naming
    ``argument`` when it can only be a folder and is not one that holds a model
    (:func:`check_model_folder`; a hub id is not checked: that needs the network).

    Without this a missing folder reaches the user as transformers' "Repo id must be in the form
    'repo_name' or 'namespace/repo_name'", which names neither the argument nor the path.
    """
    folder = os.path.expanduser(value)  # transformers does not expand ``~``
    if os.path.isdir(folder):
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise ValueError(
                f"{argument} {value!r} is a folder without config.json; pass a folder written by "
                "model.save_pretrained(folder), or a hub id ('name' or 'namespace/name')"
            )
        check_model_folder(folder, value, argument)
        return folder
    if os.path.exists(folder):
        raise ValueError(
            f"{argument} {value!r} is a file; pass the folder that holds the model's config.json and weights"
        )
    if looks_like_path(value):
        raise ValueError(
            f"{argument} {value!r} is not a folder and not a model id (a hub id is 'name' or 'namespace/name'); "
            "pass an existing folder written by model.save_pretrained(folder), or a hub id"
        )
    return value


def check_model_available(value: str, argument: str) -> str:
    """:func:`check_model_source`, and also a hub id must be loadable: in the local Hugging Face
    cache, or on a hub that answers. A ValueError in one line says what is wrong otherwise: a path
    that does not exist (with a folder of a close name beside it, if any), or a hub id that is
    neither a folder here, nor cached, nor reachable (``HF_HUB_OFFLINE`` set, or no network).

    For command lines, before any model loads: transformers answers a missing folder with "Repo id
    must be in the form ..." and an unknown hub id offline with a connection error after about
    20 s of retries. It asks the hub (one request, 10 s at most) only for a hub id not cached.
    """
    folder = os.path.expanduser(value)
    near = ""
    if not os.path.exists(folder):
        parent, name = os.path.split(os.path.abspath(folder))
        siblings = os.listdir(parent) if os.path.isdir(parent) else []
        close = difflib.get_close_matches(name, [n for n in siblings if os.path.isdir(os.path.join(parent, n))], n=1)
        near = f" (did you mean {os.path.join(os.path.dirname(value), close[0])}?)" if close else ""
        if looks_like_path(value):
            raise ValueError(f"{argument} {value}: no such folder{near}")
    source = check_model_source(value, argument)
    if os.path.isdir(source) or isinstance(try_to_load_from_cache(value, "config.json"), str):
        return source
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set, so the hub was not asked"
    else:
        try:
            model_info(value, timeout=10)
            return source
        except RepositoryNotFoundError:
            why = "the hub has no such model (a private one needs `hf auth login`)"
        except Exception as error:  # the HTTP client's own errors (httpx or requests, by huggingface_hub version)
            why = f"the hub did not answer ({type(error).__name__}: {' '.join(str(error).split())})"
    raise ValueError(
        f"{argument} {value}: no such folder{near}, not in the local Hugging Face cache, and {why}; "
        f"pass {argument} <a local model folder>, or load it once where the hub can be reached"
    )


@contextmanager
def load_errors(value: str, argument: str) -> Iterator[None]:
    """The errors of loading ``value`` that :func:`check_model_source` cannot foresee, re-raised
    naming ``argument``, with transformers' as the cause: config.json's sizes not fitting the
    weights (only loading compares the two), a ValueError; any OSError (for a hub id: no network,
    a typo, a private repo), with transformers' reason after the prefix. Every call of
    ``from_pretrained`` on a name the user gave runs under it."""
    try:
        yield
    except RuntimeError as error:
        # transformers 5 ("You set `ignore_mismatched_sizes` to `False`") and 4 ("size mismatch
        # for ...: consider adding `ignore_mismatched_sizes=True`") both name the option.
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ValueError(
            f"{argument} {value!r}: the sizes in {os.path.join(value, 'config.json')} (hidden_size, vocab_size, "
            "...) do not fit the tensors of its weights; put back the config.json saved with these weights "
            "(model.save_pretrained(folder) writes the two together)"
        ) from error
    except OSError as error:
        raise OSError(f"{argument} {value!r} could not be loaded: {error}") from error


def load_agents(
    agent_model: str | os.PathLike[str],
    num_agents: int,
    model_kwargs: dict[str, Any],
    argument: str = "agent_model",
) -> list[torch.nn.Module]:
    """``num_agents`` independent copies of the model ``agent_model`` (a folder or hub id).

    ``argument`` is the trainer argument the value came from ("agent_model", "critic_model"),
    so that an error names what the user wrote.
    """
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise ValueError(f"num_agents must be an integer >= 1, got {num_agents!r}")
    if isinstance(agent_model, os.PathLike):
        agent_model = os.fspath(agent_model)
    if not isinstance(agent_model, str):
        raise TypeError(f"{argument} must be a folder or a hub id (str), got {type(agent_model).__name__}")
    source = check_model_source(agent_model, argument)
    with load_errors(agent_model, argument):
        return [AutoModelForCausalLM.from_pretrained(source, **model_kwargs) for _ in range(num_agents)]


def model_sources(
    agents: Sequence[Any], agent_model: str | os.PathLike[str] | None, model_kwargs: dict[str, Any]
) -> list[torch.nn.Module]:
    """The agents given as a list, each entry a model or a folder / hub id to load (as
    comlrl 1.4.3 accepted). With ``agent_model`` as well, every entry must be that model
    (its name, or a model loaded from it): the two arguments then say the same thing."""
    if isinstance(agents, str | bytes | os.PathLike) or not isinstance(agents, Sequence):
        raise TypeError(f"agents must be a list of models or model names, got {type(agents).__name__}")
    if agent_model is not None:
        wanted = os.fspath(agent_model)
        for i, entry in enumerate(agents):
            name = os.fspath(entry) if isinstance(entry, str | os.PathLike) else getattr(entry, "name_or_path", None)
            if name != wanted:
                raise ValueError(
                    f"agent_model={wanted!r} and agents[{i}] ({name!r}) disagree: "
                    "pass only one of agent_model and agents"
                )
    return [
        load_agents(entry, 1, model_kwargs, argument=f"agents[{i}]")[0]
        if isinstance(entry, str | os.PathLike)
        else entry
        for i, entry in enumerate(agents)
    ]


def check_agents(agents: Sequence[torch.nn.Module], shared_base_allowed: bool = False) -> list[torch.nn.Module]:
    """Each agent must be its own generating model: two agents sharing one object would
    share parameters while two optimizers update them. With adapters
    (``shared_base_allowed``), the same object for EVERY agent is one shared base model."""
    agents = list(agents)
    if not agents:
        raise ValueError("agents is empty: pass at least one model (or agent_model=<name> and num_agents)")
    seen: dict[int, int] = {}
    for i, agent in enumerate(agents):
        if not isinstance(agent, torch.nn.Module) or not hasattr(agent, "generate"):
            raise TypeError(f"agents[{i}] must be a causal LM with .generate(), got {type(agent).__name__}")
        if id(agent) in seen and not (shared_base_allowed and len({id(a) for a in agents}) == 1):
            raise ValueError(
                f"agents[{i}] is the same object as agents[{seen[id(agent)]}]; each agent needs its own model instance"
            )
        seen[id(agent)] = i
    return agents


def resolve_tokenizers(
    tokenizer: Any,
    agents: Sequence[torch.nn.Module],
    tokenizer_kwargs: dict[str, Any] | None = None,
    role: str = "agent",
) -> list[Any]:
    """One tokenizer per agent (or per ``role``: "critic"), each able to pad.

    ``tokenizer`` may be one tokenizer for all agents, a list with one per agent, or None
    (each agent's tokenizer is then loaded from the folder or id it was loaded from).
    A tokenizer without a pad token pads with its EOS token; this is said once per tokenizer.
    """
    if tokenizer is None:
        tokenizers = []
        for i, agent in enumerate(agents):
            source = getattr(agent, "name_or_path", "") or ""
            if not source:
                raise ValueError(
                    f"tokenizer is None and {role}s[{i}] does not say where it was loaded from; pass a tokenizer"
                )
            tokenizers.append(AutoTokenizer.from_pretrained(source, **(tokenizer_kwargs or {})))
    else:
        tokenizers = per_agent(tokenizer, len(agents), "tokenizers" if role == "agent" else f"{role} tokenizers")
    fixed: set[int] = set()
    for i, tok in enumerate(tokenizers):
        if tok.pad_token_id is not None or id(tok) in fixed:
            continue
        if tok.eos_token is None:
            raise ValueError(f"the tokenizer of {role} {i} has neither a pad token nor an EOS token")
        warnings.warn(
            f"the tokenizer of {role} {i} has no pad token; padding with its EOS token {tok.eos_token!r}",
            stacklevel=3,
        )
        tok.pad_token = tok.eos_token
        fixed.add(id(tok))
    return tokenizers


def enable_activation_checkpointing(agent: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (non-reentrant: works with frozen bases and
    adapters). transformers 5.x renamed gradient checkpointing to activation checkpointing."""
    kwargs = {"use_reentrant": False}
    if hasattr(agent, "activation_checkpointing_enable"):
        agent.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        agent.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
