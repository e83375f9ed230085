"""What a model name must be before anything loads it: a hub id, or a folder that holds a
whole model (a config naming an architecture transformers knows, complete weight files); and
the loading errors transformers raises, said in the user's words (the argument, the file, what
to do)."""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import transformers
from huggingface_hub import constants, model_info, try_to_load_from_cache
from huggingface_hub.errors import RepositoryNotFoundError
from safetensors import SafetensorError, safe_open
from transformers import CONFIG_MAPPING

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
