"""The compiled decoding loop against the eager one, in fp32 and bf16, against the matrix-product floor.

    python benchmarks/bench_compiled_decoding.py              # 2 prompts x 8 samples x 64 tokens, 3 rounds
    python benchmarks/bench_compiled_decoding.py --rounds 5 --tokens 128

The embedded default model (SmolLM2-135M-Instruct), the trainer's sampling (temperature 0.6,
top-k 50, top-p 0.6), every completion forced to ``--tokens`` (``min_new_tokens``). For each
dtype (fp32, then a bf16 copy): one warm-up of each loop (the compiled one compiles there)
and of the floor, then ``--rounds`` rounds alternating eager, compiled and floor in this
process; prints each side's median generated tokens/s, their ratio and each as a % of the
floor. The floor: every ``nn.Linear`` of the model (the LM head of 49152 outputs included)
applied to ``rows`` vectors of the dtype once per token, the matrix products alone, which no
decoding loop can beat. Then the one-time compile seconds of each bucket
(:func:`comlrl.rollout.compiled_decoding.compile_seconds`). Also the share of tokens the two
loops drew alike in their warm-ups (same generator seed).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import measure
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path
from comlrl.rollout.compiled_decoding import compile_seconds, decode_compiled
from comlrl.rollout.decoding import DecodingSettings, decode


def seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def matmul_floor(model: torch.nn.Module, rows: int, tokens: int) -> Callable[[], None]:
    """Every linear layer of ``model`` applied to ``rows`` vectors of its dtype, ``tokens`` times."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {(w.shape[1], w.dtype): torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}

    def run() -> None:
        for _ in range(tokens):
            for w in weights:
                torch.nn.functional.linear(inputs[w.shape[1], w.dtype], w)

    return run


def compare(loops: dict[str, Callable[[], object]], rounds: int, tokens: int) -> tuple[dict[str, float], dict]:
    """Median tokens/s of each of ``loops`` over ``rounds`` alternated rounds after one warm-up
    each, and what each warm-up returned."""
    outputs = {name: work() for name, work in loops.items()}
    times = {name: [] for name in loops}
    for _ in range(rounds):
        for name, work in loops.items():
            times[name].append(seconds(work))
    return {name: tokens / statistics.median(spent) for name, spent in times.items()}, outputs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measure.add_shape_args(parser, tokens=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds per dtype (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("comlrl.rollout.compiled_decoding").setLevel(logging.INFO)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    fp32 = AutoModelForCausalLM.from_pretrained(path).eval()
    models = {"fp32": fp32, "bf16": AutoModelForCausalLM.from_pretrained(path).eval().to(torch.bfloat16)}
    ids, mask = measure.repeated_prompts(tokenizer, args.prompts, args.samples)
    rows, generated = ids.shape[0], ids.shape[0] * args.tokens
    settings = DecodingSettings(
        max_new_tokens=args.tokens, do_sample=True, temperature=0.6, top_k=50, top_p=0.6, min_new_tokens=args.tokens
    )
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id

    def decoding(loop: Callable[..., object], model: torch.nn.Module) -> Callable[[], object]:
        return lambda: loop(model, ids, mask, settings, eos, pad, torch.Generator().manual_seed(0))

    print(f"{rows} rows x {args.tokens} tokens, {torch.get_num_threads()} threads, {args.rounds} rounds", flush=True)
    with torch.inference_mode():
        for dtype, model in models.items():
            loops = {loop.__name__: decoding(loop, model) for loop in (decode, decode_compiled)}
            loops["floor"] = matmul_floor(model, rows, args.tokens)
            rates, outputs = compare(loops, args.rounds, generated)
            eager, compiled, floor = rates["decode"], rates["decode_compiled"], rates["floor"]
            same = (outputs["decode"].ids == outputs["decode_compiled"].ids).float().mean()
            print(
                f"{dtype}: eager {eager:6.1f} tok/s ({eager / floor:.0%} of the floor), compiled {compiled:6.1f} tok/s "
                f"({compiled / floor:.0%}), compiled/eager x{compiled / eager:.2f}; matmul floor {floor:6.1f} tok/s; "
                f"same tokens drawn: {same:.1%}",
                flush=True,
            )
    for bucket, spent in compile_seconds().items():
        print(f"compiled {bucket}: {', '.join(f'{s:.1f} s' for s in spent)}")


if __name__ == "__main__":
    main()
