"""Where generation time goes: the trainer's sampling loop against Hugging Face ``generate``,
one agent and two agents in parallel threads, against the time of the model's matrix products
alone at the same shape (a floor no decoding loop can beat on this machine).

    python benchmarks/profile_generate.py                 # 2 prompts x 8 samples x 32 tokens
    python benchmarks/profile_generate.py --prompts 4 --tokens 64 --rows 15

Prints generated tokens/s of: ``generate`` (sampling as the trainer does: temperature 0.6,
top-p 0.6, top-k 50, every completion forced to ``--tokens``); the lean loop
(``comlrl.rollout.decoding.decode``), one agent with all threads; two agents at once, one
thread each (what the trainer does on the CPU); and the floor: every ``nn.Linear`` of the
model (the LM head included) applied to ``rows`` vectors once per token, one agent, then two
agents with a thread each; and as many FLOPs of products of ``rows`` vectors with one weight
that stays in the cache (no decoding loop can do better than that). Then the operators that
took the most CPU time in the lean loop.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import measure
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path
from comlrl.rollout.decoding import DecodingSettings, decode


def seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def in_threads(works: list[Callable[[], object]]) -> Callable[[], None]:
    """Run ``works`` at once, one thread each with one intra-op thread (as the trainer does).
    Inference mode is a thread's own state: each thread enters it, as the trainer's sampling
    does (without it, the loop in threads recorded autograd graphs and ran at half speed)."""

    def one(work: Callable[[], object]) -> None:
        torch.set_num_threads(1)
        with torch.inference_mode():
            work()

    def run() -> None:
        with ThreadPoolExecutor(max_workers=len(works)) as pool:
            list(pool.map(one, works))

    return run


def linear_floor(model: torch.nn.Module, rows: int, tokens: int) -> Callable[[], None]:
    """Every linear layer of ``model`` applied to ``rows`` vectors, ``tokens`` times."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

    def run() -> None:
        for _ in range(tokens):
            for w in weights:
                torch.nn.functional.linear(inputs[w.shape[1]], w)

    return run


def cached_linear_floor(model: torch.nn.Module, rows: int, tokens: int) -> Callable[[], None]:
    """The FLOPs of :func:`linear_floor`, every product on one small weight that stays in the
    cache: what products of ``rows`` vectors reach when reading weights costs nothing."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    parameters = sum(w.numel() for w in weights)
    weight = torch.randn(weights[0].shape)
    inputs = torch.randn(rows, weight.shape[1])

    def run() -> None:
        for _ in range(tokens * parameters // weight.numel()):
            torch.nn.functional.linear(inputs, weight)

    return run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measure.add_shape_args(parser, tokens=32)
    parser.add_argument("--rows", type=int, default=12, help="operators listed (default: %(default)s)")
    args = parser.parse_args(argv)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    agents = [AutoModelForCausalLM.from_pretrained(path).eval() for _ in range(2)]
    ids, mask = measure.repeated_prompts(tokenizer, args.prompts, args.samples)
    sampling = dict(do_sample=True, temperature=0.6, top_p=0.6, top_k=50, pad_token_id=tokenizer.pad_token_id)
    sampling.update(max_new_tokens=args.tokens, min_new_tokens=args.tokens)
    settings = DecodingSettings(**{k: v for k, v in sampling.items() if k != "pad_token_id"})
    eos = [tokenizer.eos_token_id]

    def hf(model: torch.nn.Module) -> Callable[[], object]:
        return lambda: model.generate(input_ids=ids, attention_mask=mask, **sampling)

    def lean(model: torch.nn.Module) -> Callable[[], object]:
        return lambda: decode(model, ids, mask, settings, eos, tokenizer.pad_token_id, torch.Generator())

    per_call = ids.shape[0] * args.tokens
    rows = ids.shape[0]
    cases = [
        ("generate, 1 agent", hf(agents[0]), per_call),
        ("lean loop, 1 agent", lean(agents[0]), per_call),
        ("lean loop, 2 agents in threads", in_threads([lean(a) for a in agents]), 2 * per_call),
        ("linear layers alone, 1 agent", linear_floor(agents[0], rows, args.tokens), per_call),
        ("their FLOPs on a cached weight, 1 agent", cached_linear_floor(agents[0], rows, args.tokens), per_call),
        (
            "linear layers alone, 2 agents in threads",
            in_threads([linear_floor(a, rows, args.tokens) for a in agents]),
            2 * per_call,
        ),
    ]
    print(f"{rows} sequences x {args.tokens} tokens, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        for name, work, tokens in cases:
            work()  # warm-up
            print(f"{name:<42} {tokens / seconds(work):7.1f} generated tok/s", flush=True)
        with torch.profiler.profile() as profile:
            lean(agents[0])()
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
