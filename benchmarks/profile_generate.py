"""Where generation time goes: one Hugging Face ``generate`` call of the benchmark workload's
shape, profiled by operator, against a bare greedy forward loop with the KV cache.

    python benchmarks/profile_generate.py                 # 2 prompts x 8 samples x 32 tokens
    python benchmarks/profile_generate.py --prompts 4 --tokens 64 --rows 15

Prints generated tokens/s of ``generate`` (sampling as the trainer does: temperature 0.6,
top-p 0.6, top-k 50, every completion forced to ``--tokens``) and of the bare loop (no
logits processors, greedy), then the operators that took the most CPU time in ``generate``.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path

PROMPTS = [
    "Write a short story about a cat.",
    "Tell me about the sea and its waves.",
    "Describe a city in the clouds.",
    "Explain why the sky is blue.",
]


def bare_loop(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, tokens: int) -> None:
    """Greedy decoding with the KV cache and nothing else: the cost of the forwards alone."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    for _ in range(tokens - 1):
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(next_ids)], dim=1)
        out = model(input_ids=next_ids, attention_mask=mask, cache=out.cache, use_cache=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per call (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=12, help="operators listed (default: %(default)s)")
    args = parser.parse_args(argv)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    ids = encoded["input_ids"].repeat_interleave(args.samples, dim=0)
    mask = encoded["attention_mask"].repeat_interleave(args.samples, dim=0)
    sampling = dict(do_sample=True, temperature=0.6, top_p=0.6, top_k=50, pad_token_id=tokenizer.pad_token_id)
    sampling.update(max_new_tokens=args.tokens, min_new_tokens=args.tokens)
    generated = ids.shape[0] * args.tokens
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, **sampling)  # warm-up
        started = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, **sampling)
        generate_rate = generated / (time.perf_counter() - started)
        started = time.perf_counter()
        bare_loop(model, ids, mask, args.tokens)
        bare_rate = generated / (time.perf_counter() - started)
        print(
            f"generate: {generate_rate:.1f} tok/s; bare greedy forward loop: {bare_rate:.1f} tok/s "
            f"({ids.shape[0]} sequences x {args.tokens} tokens, {torch.get_num_threads()} threads)"
        )
        with torch.profiler.profile() as profile:
            model.generate(input_ids=ids, attention_mask=mask, **sampling)
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
