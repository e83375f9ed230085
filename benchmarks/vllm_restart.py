"""How long a vllm backend takes to start in a new run, with its engine folder at the path of the
last run against a path never seen (vLLM's CPU build; a few minutes).

    cd benchmarks && PYTHONPATH=.. ../.venv-vllm/bin/python vllm_restart.py          # `make test-vllm` builds it
    cd benchmarks && PYTHONPATH=.. ../.venv-vllm/bin/python vllm_restart.py --json restart.json

vLLM keys its compile cache on the model's path (``ModelConfig.compute_hash``), so the backend
loads its engines from a folder whose path stays the same from run to run
(:class:`comlrl.rollout.vllm_setup.EngineFolder`, under ``$COMLRL_CACHE``). Each run here is a
fresh process, as a user's next run is, that builds a ``VLLMBackend`` for one agent (the
embedded SmolLM2-135M-Instruct, fp32, on the CPU) and samples once. Three runs, in order:

  1. ``first``: a cache folder never used (``COMLRL_CACHE`` a new temporary folder): compiles.
  2. ``same_path``: the same cache folder again: the path of run 1, what a user's next run gets.
  3. ``new_path``: another new folder: what every run got when the engines' folder was a fresh
     temporary one.

Per run: seconds to build the backend (engine start, with its compile or its cache's load), seconds
of the sampling call, and how many entries it added to vLLM's compile cache
(``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile``, ``~/.cache/vllm`` by default). The
ratio ``new_path`` / ``same_path`` of the start is the figure; run 2 must add no entry.
Prints one JSON object; exits 1 when run 2 compiled again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def compile_entries() -> set[str]:
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
    folder = Path(root) / "torch_compile_cache" / "torch_aot_compile"
    return set(os.listdir(folder)) if folder.is_dir() else set()


def child(model: str) -> dict:
    """One run: build the backend (its folder under ``$COMLRL_CACHE``), sample once, close."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.rollout.vllm_backend import VLLMBackend

    tokenizer = AutoTokenizer.from_pretrained(model)
    agent = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    before = compile_entries()
    started = time.perf_counter()
    backend = VLLMBackend([agent], [tokenizer], [None], lambda agent: None, 0.3, torch.float32)
    start_s = time.perf_counter() - started
    started = time.perf_counter()
    rollout = backend.generate(0, ["Write a story about a cat."], 4, {"do_sample": True, "max_new_tokens": 16})
    sample_s = time.perf_counter() - started
    folder = backend._folder.name
    backend.close()
    return {
        "engine_folder": folder,
        "start_s": round(start_s, 2),
        "sample_s": round(sample_s, 2),
        "completions": len(rollout.texts),
        "compile_cache_entries_added": len(compile_entries() - before),
    }


def run(name: str, cache: str, model: str) -> dict:
    env = {**os.environ, "COMLRL_CACHE": cache}
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--model", model], env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"error: run {name!r} failed:\n{done.stderr[-4000:]}")
    return {"run": name, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    parser.add_argument("--json", default=None, help="also write the report to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model)))
        return
    from comlrl.models import default_model_path

    model = args.model or str(default_model_path())
    with tempfile.TemporaryDirectory(prefix="vllm-restart-") as same, tempfile.TemporaryDirectory() as other:
        runs = [run("first", same, model), run("same_path", same, model), run("new_path", other, model)]
    first, again, new = runs
    report = {
        "model": model,
        "runs": runs,
        "same_path_is_the_first_runs": again["engine_folder"] == first["engine_folder"],
        "start_ratio_new_path_over_same_path": round(new["start_s"] / again["start_s"], 2),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if not report["same_path_is_the_first_runs"] or again["compile_cache_entries_added"]:
        sys.exit("error: the second run did not find the first run's compiled engine")


if __name__ == "__main__":
    main()
