"""Stop strings in sampling: the code task's answers sampled with ``stop_strings`` by the lean
loop (``comlrl.rollout.decoding``), by Hugging Face ``generate`` (where the loop used to hand
them), and by the lean loop without them (every answer runs to ``max_new_tokens`` and the reward
cuts it afterwards), on the embedded model (fp32), alternating the three in one process.

    python benchmarks/bench_stop_strings.py                      # 8 held-out problems x 4 samples, 96 tokens
    python benchmarks/bench_stop_strings.py --problems 32 --threads 1

Each side samples the main agent's first-turn prompts of the first ``--problems`` held-out
problems (``CodeTask``, the MAGRPO split, shortest first, as the example takes them) with the example's sampling (0.6 /
0.6, no top-k) from one seeded generator. Prints the median seconds of each side over
``--pairs`` rounds, the ratios, the mean completion length, and whether the lean loop with stop
strings kept exactly the tokens of the loop without them up to each stop (it should: the same
draws, cut).
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import measure
import torch

from comlrl.models import default_model_path
from comlrl.rollout import generation
from comlrl.tasks.code import CodeTask


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=8, help="held-out problems (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=4, help="samples per problem, G (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=96, help="max new tokens (default: %(default)s)")
    measure.add_timing_args(parser, pairs=3)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    tokenizer, model = measure.model_for_sampling(default_model_path(), args.threads)
    task = CodeTask(
        mode="collab", train_problems=1, eval_problems=args.problems, eval_samples=1, order="shortest", split="magrpo"
    )
    try:
        prompts = [task.formatters(tokenizer)[1](row) for row in task.dataset("eval")]
        stops = task.stop_strings
    finally:
        task.close()
    base = {"do_sample": True, "temperature": 0.6, "top_p": 0.6, "top_k": 0, "max_new_tokens": args.tokens}
    sides = {
        "lean loop, stop strings": ({**base, "stop_strings": stops}, False),
        "generate, stop strings": ({**base, "stop_strings": stops}, True),
        "lean loop, no stop strings": (base, False),
    }

    def timed(sampling: dict, use_generate: bool) -> tuple[float, generation.AgentRollout]:
        started = time.perf_counter()
        with mock.patch.object(generation, "decoding_settings", lambda *a: None) if use_generate else mock.MagicMock():
            torch.manual_seed(0)  # generate's draws
            rollout = generation.generate_group(
                model, tokenizer, prompts, args.samples, sampling, generator=torch.Generator().manual_seed(0)
            )
        return time.perf_counter() - started, rollout

    timed(*sides["lean loop, stop strings"])  # warm-up: the head's split check, allocator
    times: dict[str, list[float]] = {name: [] for name in sides}
    rollouts = {}
    for _ in range(args.pairs):
        for name, side in sides.items():
            seconds, rollouts[name] = timed(*side)
            times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{args.problems} problems x {args.samples} samples, up to {args.tokens} new tokens, "
        f"{torch.get_num_threads()} threads, fp32"
    )
    for name, values in times.items():
        tokens = rollouts[name].lengths.float().mean().item()
        print(f"{name:27s} {medians[name]:6.2f} s ({', '.join(f'{t:.2f}' for t in values)}), {tokens:.1f} tokens")
    lean = medians["lean loop, stop strings"]
    print(
        f"generate / lean loop with stop strings: x{medians['generate, stop strings'] / lean:.2f}; "
        f"no stop strings / stop strings: x{medians['lean loop, no stop strings'] / lean:.2f}"
    )
    cut, free = rollouts["lean loop, stop strings"], rollouts["lean loop, no stop strings"]
    same = all(
        torch.equal(cut.completion_ids[row, :n], free.completion_ids[row, :n]) for row, n in enumerate(cut.lengths)
    )
    print(f"the loop with stop strings kept the free loop's tokens up to each stop: {same}")


if __name__ == "__main__":
    main()
