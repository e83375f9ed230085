"""benchmarks/gpu_check.py on the CPU (``--device cpu --tiny``), the path a GPU machine runs
at full size: ``--prepare`` writes the embedded model's config and tokenizer without its
weights, every case runs on them and reports positive figures, and the script imports with no
``datasets``, which such a machine may lack."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # reads the embedded model's files; ~30 s on two cores

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
CASES = ("magrpo_eager", "magrpo_compiled", "logprob_gap", "fsdp_full_shard")


@pytest.fixture
def gpu_check(monkeypatch):
    """The script as a module (it imports its sibling ``workload`` as a script would)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gpu_check")


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def check_trainer_case(case: dict, bf16: bool) -> None:
    assert case["agent_dtype"] == ("torch.bfloat16" if bf16 else "torch.float32")
    assert len(case["steps"]) == 2
    for step in case["steps"]:
        assert all(positive(step[key]) for key in ("wall_s", "generate_s", "update_s", "generated_tokens_per_s"))
    if bf16:  # the trainer keeps the sampler's log-probs only in bf16
        assert all(0 <= gap < 0.5 for gaps in case["sampler_logprob_gap"].values() for gap in gaps)
    else:
        assert "sampler_logprob_gap" not in case


def test_prepared_files_hold_no_weights(gpu_check, tmp_path):
    assert gpu_check.main(["--prepare", str(tmp_path)]) == 0
    names = {path.name for path in tmp_path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(gpu_check.is_weights(name) for name in names)
    assert sum(path.stat().st_size for path in tmp_path.iterdir()) < 8 * 2**20


def test_cpu_tiny_run_passes_every_case(gpu_check, tmp_path):
    files, out = tmp_path / "files", tmp_path / "out"
    assert gpu_check.main(["--prepare", str(files)]) == 0
    argv = ["--device", "cpu", "--tiny", "--model-files", str(files), "--compile-backend", "eager", "--out", str(out)]
    assert gpu_check.main(argv) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["ok"] and report["model"]["layers"] == 2
    assert set(report["cases"]) == {f"{dtype}/{case}" for dtype in ("float32", "bfloat16") for case in CASES}
    for name, case in report["cases"].items():
        assert case["ok"], (name, case.get("traceback"))
        assert positive(case["seconds"]) and case["peak_cuda_mib"] is None
    for dtype in ("float32", "bfloat16"):
        bf16 = dtype == "bfloat16"
        check_trainer_case(report["cases"][f"{dtype}/magrpo_eager"], bf16)
        compiled = report["cases"][f"{dtype}/magrpo_compiled"]
        check_trainer_case(compiled, bf16)
        # In-process, an earlier test may have compiled this bucket already.
        assert all(positive(s) for c in compiled["compiles"] for s in c["seconds"])
        gaps = report["cases"][f"{dtype}/logprob_gap"]
        for loop in ("eager", "compiled"):
            assert positive(gaps[loop]["tokens_per_s"]) and gaps[loop]["tokens"] > 0
            assert 0 <= gaps[loop]["mean_abs"] <= (0.5 if bf16 else gpu_check.FP32_GAP_MAX)
        fsdp = report["cases"][f"{dtype}/fsdp_full_shard"]
        assert fsdp["backend"] == "gloo" and fsdp["compute_dtype"] == f"torch.{dtype}"
        assert all(positive(s) for s in fsdp["step_s"]) and all(positive(loss) for loss in fsdp["losses"])


def test_the_script_imports_without_datasets():
    """``None`` in ``sys.modules`` makes ``import datasets`` (and dill's, multiprocess's) fail."""
    code = (
        "import sys; sys.modules.update(datasets=None, dill=None, multiprocess=None); "
        f"sys.path.insert(0, {str(BENCHMARKS)!r}); import gpu_check"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
