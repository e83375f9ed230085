"""Count what one MAGRPO training step runs through: the library's files, named functions and
folders, traced with ``sys.setprofile`` (comprehensions, generator expressions and lambdas are
not counted as functions). A measure of how far a reader follows one step, for the
architecture's "readable in one screen" goal.

    python benchmarks/trace_step.py               # the embedded model, 2 agents, one turn
    python benchmarks/trace_step.py --per-file    # and each file's count

Workload: two agents on the embedded model (fp32, CPU), G = 2, 4 new tokens, one dataset row;
a first step is run untraced so that what is set up once is left out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from transformers import AutoModelForCausalLM, AutoTokenizer

import comlrl
from comlrl.models import default_model_path
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

ROOT = os.path.dirname(os.path.abspath(comlrl.__file__))


def traced_step(trainer: MAGRPOTrainer, row: int) -> dict[str, set[str]]:
    """The library's named functions one ``training_step`` calls, by file (relative to the package)."""
    called: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(ROOT + os.sep) and not code.co_name.startswith("<"):
            called.setdefault(os.path.relpath(code.co_filename, os.path.dirname(ROOT)), set()).add(code.co_qualname)

    sys.setprofile(profile)
    try:
        trainer.training_step([row])
    finally:
        sys.setprofile(None)
    return called


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-file", action="store_true", help="also print each file's count of functions")
    args = parser.parse_args(argv)
    name = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(name)
    with tempfile.TemporaryDirectory() as folder:
        trainer = MAGRPOTrainer(
            agents=[AutoModelForCausalLM.from_pretrained(name) for _ in range(2)],
            tokenizer=tokenizer,
            reward_func=lambda a, b: [float(len(y) > len(x)) for x, y in zip(a, b)],
            train_dataset=[{"prompt": "Describe a city in the clouds:"}, {"prompt": "Tell a joke about dinosaurs:"}],
            args=MAGRPOConfig(num_generations=2, max_new_tokens=4, output_dir=folder),
        )
        trainer.training_step([0])  # what is made once (optimizer state, compiled paths) stays out
        called = traced_step(trainer, 1)
    functions = sum(len(names) for names in called.values())
    folders = {os.path.dirname(path) for path in called}
    print(f"one MAGRPO step: {len(called)} files, {functions} functions, {len(folders)} folders")
    if args.per_file:
        for path in sorted(called):
            print(f"  {path}: {len(called[path])}")


if __name__ == "__main__":
    sys.exit(main())
