"""The update's forward + backward with each distinct prompt computed once, against one
forward over the whole rows, alternated in the same process (A B A B).

    python benchmarks/bench_update.py                    # 2 prompts x 8 samples x 64 tokens
    python benchmarks/bench_update.py --pairs 5 --prompts 4
    python benchmarks/bench_update.py --prompts 1 --samples 8 --prompt-tokens 9 --tokens 64

One agent (the embedded model, fp32) and the workload's first prompts as raw text (or
random prompts of ``--prompt-tokens`` tokens), G completions of exactly ``--tokens`` tokens
(random ids: the cost does not depend on which), a loss over every log-prob, one backward.
Printed per pass: seconds, and the share of the matrix-product rate (measured in the same
process, between the passes) that 6 * P * T FLOPs reach, T counting every token of every row
as trained (the issue's count, so computing a prompt once shows as a higher rate); then the
median plain/shared time ratio. Shared here means always (``share_prompts=True``); the
trainer shares only where that saves ``min_saved_prompt_tokens(device)`` tokens or more.
"""

from __future__ import annotations

import argparse
import statistics
import time

import measure
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path
from comlrl.models.forward import completion_logprobs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measure.add_shape_args(parser, tokens=64)
    parser.add_argument("--pairs", type=int, default=3, help="A B pairs (default: %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="random prompts of this length instead")
    args = parser.parse_args(argv)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).train()
    if args.prompt_tokens:
        prompts = torch.randint(len(tokenizer), (args.prompts, args.prompt_tokens), generator=torch.Generator())
        prompt_ids = prompts.repeat_interleave(args.samples, dim=0)
        prompt_mask = torch.ones_like(prompt_ids)
    else:
        prompt_ids, prompt_mask = measure.repeated_prompts(tokenizer, args.prompts, args.samples)
    rows = len(prompt_ids)
    completion_ids = torch.randint(len(tokenizer), (rows, args.tokens), generator=torch.Generator())
    completion_mask = torch.ones(rows, args.tokens, dtype=torch.bool)
    flops = 6 * measure.parameter_count(model) * rows * (prompt_ids.shape[1] + args.tokens)

    def update(share_prompts: bool) -> float:
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        logps = completion_logprobs(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.6, share_prompts=share_prompts
        )
        logps.sum().backward()
        return time.perf_counter() - started

    shape = f"{rows} rows x ({prompt_ids.shape[1]} prompt + {args.tokens} completion) tokens"
    print(f"{shape}, {torch.get_num_threads()} threads")
    update(True), update(False)  # warm-up
    ratios = []
    for pair in range(args.pairs):
        times = {}
        for name, share in (("plain", False), ("shared", True)):
            times[name] = update(share)
            rate = measure.matmul_gflops()
            utilisation = flops / times[name] / 1e9 / rate
            figures = f"{times[name]:6.2f} s  {utilisation:5.0%} of {rate:.0f} GFLOP/s"
            print(f"pair {pair + 1} {name:<7} {figures}", flush=True)
        ratios.append(times["plain"] / times["shared"])
    print(f"plain/shared time: {', '.join(f'x{r:.2f}' for r in ratios)}; median x{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
