"""Check the trainer on one CUDA GPU without vLLM or model weights (sized for 3-5 minutes on one H100 or H200).

    python benchmarks/gpu_check.py --prepare DIR          # where comlrl has its embedded model
    python benchmarks/gpu_check.py --model-files DIR      # on the GPU: bfloat16, then float32, cuda:0
    python benchmarks/gpu_check.py --device cpu --tiny --model-files DIR --compile-backend eager

The report goes to ``$OUT/gpu_check.json`` where ``$OUT`` is set (a lent GPU machine's folder
that comes back to the caller: pass no ``--out`` there), else to benchmarks/results/;
``--out DIR`` overrides both. As each case finishes, one line goes to stdout: ``gpu_check:
CASE DTYPE ok|ERROR ...: key figures`` (see ``gpu_check_parts.summary_line``).

The agents are RANDOM models of SmolLM2-135M-Instruct's shape (its ``config.json``, seeded)
with its tokenizer: what is timed and compared here does not depend on trained weights, and the
files to carry are a few MB instead of 0.5 GB. Random weights give near-uniform logits (std
0.48 over the vocabulary, entropy 10.5 nats), which would understate the bf16 gap between
sampler and learner: each model's final norm weight (``model.model.norm.weight``) is scaled so
that its logits' std over the vocabulary, averaged over a fixed prompt's positions, is
``LOGIT_STD`` = 3.5, what the trained SmolLM2-135M-Instruct gives (3.2-3.45 on these prompts);
its sampled tokens' entropy at T = 0.6 is then 0.9 nats, as the trained model's (0.9-1.0).
``--prepare DIR`` writes those files (the embedded model's folder without its weights);
``--model-files DIR`` reads them. comlrl imports no ``datasets``, so a machine with torch and
transformers runs this from a checkout (``PYTHONPATH=$PWD``). The compiled cases need a
transformers whose decoders take a ``cache`` argument, as 5.24 (requirements-dev.txt's pin)
does; 5.17 names it ``past_key_values``, so compiled decoding falls back to the eager loop
there, and those cases fail saying so. benchmarks/gpu_wheels.sh fetches the transformers wheel
(and datasets', for the examples).

Cases, for each ``--dtype`` (default: bfloat16, the precision users train in, then float32):

  magrpo_eager, magrpo_compiled: four MAGRPO training steps (``MAGRPOTrainer.training_step``;
      2 agents on the device, 2 prompts per step of 8, G = 8 completions of exactly 64 tokens
      through ``min_new_tokens``, the story-len-ratio reward; ``precision="bf16"`` for bfloat16)
      with the hf backend's eager decoding loop, then with ``compiled_decoding=True``. Per step:
      wall, generation and update seconds, generated tokens/s; ``steady``: their medians over
      the 3 steps after the first; ``first_step_extra_s``: the first step's wall over that
      median (compile and warm-up); the buckets compiled (``compile_seconds``); with bf16 the
      trainer's ``sampler_logprob_gap`` metric per step and its median.
  logprob_gap: the sampler's log-probs of its tokens (``generate_group(with_logprobs=True)``,
      eager and compiled loops, the trainer's sampling settings) against the learner's
      (``completion_logprobs``, one forward over the whole sequences): mean and max abs gap,
      the mean entropy (tempered, before top-k/top-p) of the distributions the tokens were
      drawn from, and each loop's tokens/s once warm (median of 3 calls). In fp32 the two must
      agree (mean gap at most ``FP32_GAP_MAX``), else positions, padding or the cache are wrong.
  cache_alternation (the first ``--dtype`` only): compiled decoding of one model alternating
      two shape buckets (2 prompts x G rows, then 1 prompt x G) three times; per alternation
      the static caches allocated, dynamo graphs and CUDA-graph recordings. comlrl keeps one
      static cache per (model, bucket) (``compiled_decoding._HELD``), so the last alternation
      must compile and record nothing; where an alternation allocates new caches anyway, the
      case reports it (on CUDA: the graphs are recorded again).
  fsdp_api_smoke: an API smoke test of FSDP2, NOT a test of communication. One process group
      of one rank (NCCL on CUDA, gloo on the CPU, 60 s timeout), where FSDP2 runs no
      collective: so first ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (and their
      ``*_single`` successors, which FSDP2 calls in torch 2.13, where this torch has them) on a
      small tensor of the case's dtype, outputs checked; then a model sharded by
      ``comlrl.engine.sharding.shard_model`` (``full_shard``, bf16 compute for bfloat16),
      gathered whole for a no-grad forward as for sampling, released, then four steps of
      forward, backward and AdamW on a batch of random tokens (medians over the last 3).

The compiled cases (magrpo_compiled, logprob_gap, cache_alternation) report ``compiler``: what
``torch._dynamo.utils.counters`` counted during the case: dynamo graphs (``stats/unique_graphs``,
first compiles and recompiles), ``recompiles`` (compiles of a bucket compiled before, from
``compile_seconds``) with dynamo's ``recompile_reasons`` (its compilation records), graph breaks
(``graph_break``, with reasons), CUDA-graph skips (``inductor/cudagraph_skips``, with the
messages) and CUDA-graph recordings (calls of the CUDA-graph tree's ``record_function``: first
recordings and re-recordings; 0 on the CPU). The cases are in gpu_check_cases.py, what they use
in gpu_check_parts.py.

Each case reports its peak CUDA memory (``torch.cuda.max_memory_allocated``, reset before
it; null on the CPU) and ``ok``, or the error it raised: one failing case does not stop the
others. The JSON object (versions, device, model, cases) is written again after every case, so
that a run stopped part-way keeps what it measured, and is printed at the end; the exit status
is 1 when a case failed.

``--tiny`` (2 layers, hidden size 64, the same tokenizer, 8 tokens, G = 4) makes a CPU smoke
run (tests/test_gpu_check.py); ``--compile-backend eager`` compiles the decoding step with
dynamo's eager backend there (graph capture and the static cache are exercised, no kernels
are generated), seconds instead of a minute of inductor per dtype.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_cases import DTYPES, Check, run_case
from gpu_check_parts import LOGIT_PROMPT, LOGIT_STD, compile_backend, compiler_watch, environment, prepare, summary_line

REPORT_NAME = "gpu_check.json"


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")


def default_out() -> str:
    """``$OUT`` where it is set (what a lent GPU machine sends back), else benchmarks/results."""
    return os.environ.get("OUT") or str(Path(__file__).resolve().parent / "results")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", metavar="DIR", help="write the model's config and tokenizer files here, exit")
    parser.add_argument("--model-files", metavar="DIR", help="what --prepare wrote (default: the embedded model)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: %(default)s)")
    parser.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES), help="default: bfloat16 float32")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and a few tokens: a CPU smoke run")
    parser.add_argument("--num-generations", type=int, default=None, help="G (default: 8, 4 with --tiny)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens (default: 64, 8 with --tiny)")
    parser.add_argument(
        "--compile-backend",
        default="default",
        choices=("default", "eager", "aot_eager"),
        help="dynamo backend of the compiled decoding step; default: the library's (inductor, CUDA graphs on CUDA)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and sampling (default: %(default)s)")
    parser.add_argument("--out", default=None, help=f"folder of {REPORT_NAME} (default: $OUT, else benchmarks/results)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare:
        sizes = prepare(Path(args.prepare))
        print(json.dumps({"prepared": args.prepare, "files": sizes, "total_bytes": sum(sizes.values())}, indent=2))
        return 0
    if args.model_files is None:
        from comlrl.models import default_model_path

        args.model_files = str(default_model_path())
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device here (--device cpu runs the check on the CPU)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    check = Check(args)
    out = Path(args.out or default_out())
    print(f"gpu_check: the report goes to {out / REPORT_NAME}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "environment": environment(check.device),
        "model": {
            "files": args.model_files,
            "tiny": args.tiny,
            "layers": check.config.num_hidden_layers,
            "hidden_size": check.config.hidden_size,
            "vocab_size": check.config.vocab_size,
            "num_generations": check.num_generations,
            "max_new_tokens": check.max_new_tokens,
            "compile_backend": args.compile_backend,
            "logit_std": {"target": LOGIT_STD, "prompt": LOGIT_PROMPT, "unscaled": check.unscaled_logit_std},
        },
        "cases": {},
    }
    cases = []  # (name, work, compiled)
    for dtype in args.dtype:
        cases += [
            (f"{dtype}/magrpo_eager", functools.partial(check.magrpo, dtype, False), False),
            (f"{dtype}/magrpo_compiled", functools.partial(check.magrpo, dtype, True), True),
            (f"{dtype}/logprob_gap", functools.partial(check.logprob_gap, dtype), True),
        ]
    cases.append(
        (f"{args.dtype[0]}/cache_alternation", functools.partial(check.cache_alternation, args.dtype[0]), True)
    )
    # Last, so that no trainer is built while their process group exists (it would join it).
    cases += [(f"{dtype}/fsdp_api_smoke", functools.partial(check.fsdp, dtype), False) for dtype in args.dtype]
    with compile_backend(args.compile_backend), compiler_watch():
        for name, work, compiled in cases:
            print(f"gpu_check: running {name} ...", file=sys.stderr, flush=True)
            report["cases"][name] = result = run_case(args.device, work, compiled)
            print(summary_line(name, result), flush=True)
            report["ok"] = all(case["ok"] for case in report["cases"].values())
            report["elapsed_s"] = time.perf_counter() - started
            write(report, out)
    print(json.dumps(report, indent=2))
    print(f"gpu_check: wrote {out / REPORT_NAME}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
