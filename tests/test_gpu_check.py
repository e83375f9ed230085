"""benchmarks/gpu_check.py on the CPU (``--device cpu --tiny``), the path a GPU machine runs
at full size: ``--prepare`` writes the embedded model's config and tokenizer without its
weights, every case runs on them and reports its figures (medians of the steady steps, the
compiler's counters, the entropy beside the log-prob gap, the collectives' smoke test), one
summary line per case goes to stdout, the report to ``$OUT``; the parts that a CPU run cannot
reach (CUDA-graph recordings and skips, a collective that does nothing) are shown counted or
caught one by one; and the script imports with no ``datasets``, which such a machine may lack."""

from __future__ import annotations

import datetime
import importlib
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import transformers

pytestmark = pytest.mark.e2e  # reads the embedded model's files; about 1 min on two cores

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
DTYPES = ("bfloat16", "float32")  # the default order: the precision users train in first
CASES = ("magrpo_eager", "magrpo_compiled", "logprob_gap", "fsdp_api_smoke")
COMPILED = ("magrpo_compiled", "logprob_gap", "cache_alternation")
SUMMARY = re.compile(r"^gpu_check: (\w+) (\w+) (ok|ERROR)[ :]")


@pytest.fixture
def gpu_check(monkeypatch):
    """The script as a module (it imports its siblings as a script would)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gpu_check")


@pytest.fixture
def parts(gpu_check):
    return importlib.import_module("gpu_check_parts")


@pytest.fixture
def cases(gpu_check):
    return importlib.import_module("gpu_check_cases")


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def check_trainer_case(case: dict, bf16: bool) -> None:
    assert case["agent_dtype"] == ("torch.bfloat16" if bf16 else "torch.float32")
    assert len(case["steps"]) == 4 and case["steady_steps"] == 3
    for step in case["steps"]:
        assert all(positive(step[key]) for key in ("wall_s", "generate_s", "update_s", "generated_tokens_per_s"))
    for key, value in case["steady"].items():  # medians of the steps after the first
        assert value == statistics.median(step[key] for step in case["steps"][1:])
    assert case["first_step_extra_s"] == case["steps"][0]["wall_s"] - case["steady"]["wall_s"]
    if bf16:  # the trainer keeps the sampler's log-probs only in bf16
        gaps = [gap for per_step in case["sampler_logprob_gap"].values() for gap in per_step]
        assert len(gaps) == 8 and all(0 <= gap < 0.5 for gap in gaps)
        assert case["sampler_logprob_gap_median"] == statistics.median(gaps)
    else:
        assert "sampler_logprob_gap" not in case


def check_compiler(figures: dict) -> None:
    for key in ("graphs", "recompiles", "graph_breaks", "cudagraph_skips", "cudagraph_recordings"):
        assert isinstance(figures[key], int) and figures[key] >= 0, key
    assert figures["graph_breaks"] == 0  # the step compiles with fullgraph=True
    assert figures["cudagraph_skips"] == figures["cudagraph_recordings"] == 0  # no CUDA graphs on the CPU
    assert all(isinstance(reason, str) for reason in figures["recompile_reasons"])


def test_prepared_files_hold_no_weights(gpu_check, parts, tmp_path):
    assert gpu_check.main(["--prepare", str(tmp_path)]) == 0
    names = {path.name for path in tmp_path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(parts.is_weights(name) for name in names)
    assert sum(path.stat().st_size for path in tmp_path.iterdir()) < 8 * 2**20


def test_cpu_tiny_run_passes_every_case(gpu_check, cases, monkeypatch, capsys, tmp_path):
    files, out = tmp_path / "files", tmp_path / "out"
    assert gpu_check.main(["--prepare", str(files)]) == 0
    monkeypatch.setenv("OUT", str(out))  # a lent GPU machine's folder that comes back: no --out
    capsys.readouterr()
    assert gpu_check.main(["--device", "cpu", "--tiny", "--model-files", str(files), "--compile-backend", "eager"]) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["ok"] and report["model"]["layers"] == 2
    names = [f"{dtype}/{case}" for dtype in DTYPES for case in CASES[:3]]
    names += ["bfloat16/cache_alternation"] + [f"{dtype}/fsdp_api_smoke" for dtype in DTYPES]
    assert list(report["cases"]) == names

    # One summary line per case, in order, as each finished (before the JSON).
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("gpu_check: ")]
    assert [SUMMARY.match(line).group(2, 1, 3) for line in lines] == [(*name.split("/"), "ok") for name in names]
    for name, line in zip(names, lines):
        kind = name.split("/")[1]
        assert ("median of 3" in line) == (kind != "logprob_gap" and kind != "cache_alternation"), line
        assert ("compiler: graphs" in line) == (kind in COMPILED), line
    assert all(line.count("entropy") == 2 for line in lines if "logprob_gap" in line)
    assert all("collectives ok: all_gather_into_tensor" in line for line in lines if "fsdp" in line)

    logit_std = report["model"]["logit_std"]
    assert logit_std["target"] == 3.5 and all(0 < std < 1 for std in logit_std["unscaled"].values())
    for name, case in report["cases"].items():
        assert case["ok"], (name, case.get("traceback"))
        assert positive(case["seconds"]) and case["peak_cuda_mib"] is None
        assert ("compiler" in case) == (name.split("/")[1] in COMPILED), name
        if "compiler" in case:
            check_compiler(case["compiler"])
    for dtype in DTYPES:
        bf16 = dtype == "bfloat16"
        check_trainer_case(report["cases"][f"{dtype}/magrpo_eager"], bf16)
        compiled = report["cases"][f"{dtype}/magrpo_compiled"]
        check_trainer_case(compiled, bf16)
        # In-process, an earlier test may have compiled this bucket already.
        assert all(positive(s) for c in compiled["compiles"] for s in c["seconds"])
        gaps = report["cases"][f"{dtype}/logprob_gap"]
        for loop in ("eager", "compiled"):
            assert positive(gaps[loop]["tokens_per_s"]) and gaps[loop]["tokens"] > 0
            assert 0 <= gaps[loop]["mean_abs"] <= (0.5 if bf16 else cases.FP32_GAP_MAX)
            assert 0 <= gaps[loop]["entropy_mean"] < math.log(report["model"]["vocab_size"])
        fsdp = report["cases"][f"{dtype}/fsdp_api_smoke"]
        assert fsdp["backend"] == "gloo" and fsdp["compute_dtype"] == f"torch.{dtype}" and fsdp["timeout_s"] == 60
        assert fsdp["collectives"]["world_size"] == 1 and fsdp["collectives"]["dtype"] == f"torch.{dtype}"
        assert (
            fsdp["collectives"]["all_gather_into_tensor"]["ok"] and fsdp["collectives"]["reduce_scatter_tensor"]["ok"]
        )
        assert len(fsdp["step_s"]) == 4 and fsdp["steady"]["wall_s"] == statistics.median(fsdp["step_s"][1:])
        assert all(positive(loss) for loss in fsdp["losses"])

    # comlrl keeps one static cache per (model, bucket) (compiled_decoding._HELD): alternating
    # buckets allocates the two caches in the first round only, graphs compiled once.
    alternation = report["cases"]["bfloat16/cache_alternation"]
    assert alternation["rows"] == [8, 4] and len(alternation["alternations"]) == 3
    assert alternation["cache_per_bucket"] is True and "finding" not in alternation
    assert alternation["alternations"][0]["new_caches"] == 2
    for later in alternation["alternations"][1:]:
        assert later["new_caches"] == 0 and later["graphs"] == later["recompiles"] == 0
    assert alternation["compiler"]["graphs"] == sum(a["graphs"] for a in alternation["alternations"])


def test_report_goes_to_out_where_set(gpu_check, monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.default_out() == str(tmp_path)
    monkeypatch.delenv("OUT")
    assert gpu_check.default_out() == str(BENCHMARKS / "results")


def test_random_models_logits_are_spread_as_a_trained_models(parts):
    config = transformers.LlamaConfig(vocab_size=512, **parts.TINY)  # SmolLM2's class, --tiny's shape
    ids = torch.arange(1, 9).unsqueeze(0)
    model, unscaled = parts.random_model(Path("/nonexistent"), config, 0, "cpu", ids)
    assert unscaled < 1 and parts.logit_std(model, ids) == pytest.approx(parts.LOGIT_STD, rel=1e-4)


def test_compiler_figures_count_what_they_say(parts):
    from torch._inductor import cudagraph_trees, cudagraph_utils

    recorded = mock.Mock(return_value="recorded")

    def breaks(x):
        x = x * 2
        torch._dynamo.graph_break()
        return x + 1

    with mock.patch.object(cudagraph_trees.CUDAGraphTreeManager, "record_function", recorded):
        with parts.compiler_watch():
            before = parts.compiler_counts()
            torch.compile(breaks, backend="eager")(torch.ones(3))
            assert cudagraph_trees.CUDAGraphTreeManager.record_function(None, [], 0) == "recorded"
            cudagraph_utils.log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to a test")
            figures = parts.compiler_figures(before, parts.compiler_counts())
    assert figures["graphs"] >= 2 and figures["graph_breaks"] >= 1 and figures["graph_break_reasons"]
    assert figures["cudagraph_recordings"] == 1 and recorded.call_count == 1
    assert figures["cudagraph_skips"] == 1 and figures["cudagraph_skip_reasons"] == [
        "skipping cudagraphs due to a test"
    ]
    after = parts.compiler_counts()  # the watch is off: neither is counted any more
    cudagraph_utils.log_cudagraph_skip_and_bump_counter("skipping again")
    assert parts.compiler_figures(after, parts.compiler_counts())["cudagraph_skip_reasons"] == []


def test_collectives_smoke_catches_a_collective_that_does_nothing(parts):
    port = parts.free_port()
    timeout = datetime.timedelta(seconds=60)
    torch.distributed.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}", timeout=timeout
    )
    try:
        figures = parts.collectives_smoke("cpu", torch.bfloat16)
        assert figures["all_gather_into_tensor"]["ok"] and figures["reduce_scatter_tensor"]["ok"]
        with mock.patch.object(torch.distributed, "reduce_scatter_tensor", lambda output, source: None):
            with pytest.raises(AssertionError, match="reduce_scatter_tensor gave"):
                parts.collectives_smoke("cpu", torch.float32)
    finally:
        torch.distributed.destroy_process_group()


def test_summary_line_of_a_failed_case(parts):
    case = {"ok": False, "error": "RuntimeError: boom\nsecond line", "seconds": 1.5, "peak_cuda_mib": 512.0}
    assert parts.summary_line("float32/logprob_gap", case) == (
        "gpu_check: logprob_gap float32 ERROR RuntimeError: boom: 1.5 s; peak 512 MiB"
    )


def test_the_script_imports_without_datasets():
    """``None`` in ``sys.modules`` makes ``import datasets`` (and dill's, multiprocess's) fail."""
    code = (
        "import sys; sys.modules.update(datasets=None, dill=None, multiprocess=None); "
        f"sys.path.insert(0, {str(BENCHMARKS)!r}); import gpu_check"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
