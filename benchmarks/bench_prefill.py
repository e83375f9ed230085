"""Rows that share a prompt, prefilled once: the lean sampling loop
(``comlrl.rollout.decoding.decode``) with its shared prefill against every row prefilling its
own prompt, on the embedded model (fp32), alternating the two in one process.

    python benchmarks/bench_prefill.py                          # 2 prompts x 4 samples, 400 + 48 tokens
    python benchmarks/bench_prefill.py --prompts 8 --samples 4 --prompt-tokens 600 --threads 1

The G samples of a prompt (and evaluation rows that repeat a problem) are the same prompt, so
the prefill computes it G times; shared, the distinct prompts run once and their KV cache is
gathered out to the rows. Prints the median seconds of each side over ``--pairs`` pairs, their
ratio, and whether the two drew the same greedy tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import measure
import torch

from comlrl.models import default_model_path
from comlrl.rollout.decoding import DecodingSettings, decode

TEXT = (
    "Write a Python function that returns the sum of the squares of the even numbers in a list, "
    "with a docstring, type hints and three doctest examples; explain each step in a comment. "
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=4, help="rows per prompt, G (default: %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=400, help="tokens per prompt (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per row (default: %(default)s)")
    measure.add_timing_args(parser, pairs=3)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    tokenizer, model = measure.model_for_sampling(default_model_path(), args.threads)
    words = tokenizer(TEXT * (args.prompt_tokens // 20 + 2))["input_ids"]
    # Distinct prompts of slightly different lengths (left padding, as sampling pads them).
    prompts = [[i + 1, *words[: args.prompt_tokens - 4 * i]] for i in range(args.prompts)]
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    ids, mask = ids.repeat_interleave(args.samples, 0), mask.repeat_interleave(args.samples, 0)
    settings = DecodingSettings(max_new_tokens=args.tokens)  # greedy, no EOS: every row decodes every token

    def timed(share: bool) -> tuple[float, torch.Tensor]:
        started = time.perf_counter()
        with torch.inference_mode():
            out = decode(model, ids, mask, settings, [], tokenizer.pad_token_id, share_prompts=share)
        return time.perf_counter() - started, out.ids

    timed(True)  # warm-up: the head's split check, allocator
    times: dict[bool, list[float]] = {True: [], False: []}
    tokens = {}
    for _ in range(args.pairs):
        for share in (False, True):
            seconds, tokens[share] = timed(share)
            times[share].append(seconds)
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"{args.prompts} prompts x {args.samples} samples, {width} prompt + {args.tokens} new tokens, "
        f"{torch.get_num_threads()} threads, fp32"
    )
    print(f"every row prefills: {plain:.2f} s (median of {args.pairs}: {', '.join(f'{t:.2f}' for t in times[False])})")
    print(f"shared prefill:     {shared:.2f} s ({', '.join(f'{t:.2f}' for t in times[True])})")
    same = torch.equal(tokens[True], tokens[False])
    print(f"ratio plain / shared: x{plain / shared:.2f}; same greedy tokens: {same}")


if __name__ == "__main__":
    main()
