"""Tools with the rest of the trainer: real sampling (tiny models, the hf backend) where every
message calls a tool, so every completion is continued after a result. A run interrupted
mid-way resumes to the straight run's weights and log; LoRA agents train their adapters only;
bf16 agents train; the tool metrics count every call. (Under torchrun: tests/test_distributed.py,
``environment-tools``.)"""

import os
import signal

import pytest
import torch

from comlrl.trainers.reinforce import MAGRPOTrainer
from tests.helpers import (
    IGNORES_TOOLS,
    CountingTools,
    assert_same_run,
    chat_tokenizer,
    log_lines,
    lora,
    small_config,
    tiny_llama,
    weights,
)

ROWS = [{"prompt": word} for word in ("sea", "cat", "moon", "rain")]


def tools_trainer(tmp_path, environment=None, agents=None, **overrides):
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    values = dict(num_train_epochs=2, per_device_train_batch_size=2, save_steps=1, max_new_tokens=4)
    return MAGRPOTrainer(
        agents=agents or [tiny_llama(tokenizer, seed=i) for i in range(2)],
        tokenizer=tokenizer,
        train_dataset=ROWS,
        environment=environment or CountingTools(),
        args=small_config(tmp_path, **{**values, **overrides}),
    )


def test_every_message_calls_and_is_continued(tmp_path):
    trainer = tools_trainer(tmp_path)
    trainer.train()
    steps = [line for line in log_lines(tmp_path / "run", "metrics.jsonl") if "reward/mean" in line]
    assert len(steps) == 4
    for line in steps:
        assert line["agent0/tool_call_frac"] == line["agent1/tool_call_frac"] == 1.0
        assert line["agent0/tool_calls"] == 1.0 and line["agent0/tool_errors"] == 0.0
        assert line["agent0/completion_length"] > 4  # the message, the result and the answer


class InterruptingTools(CountingTools):
    """Sends this process SIGINT during its ``at_step``-th step call (that training step still finishes)."""

    def __init__(self, at_step):
        super().__init__()
        self.at_step = at_step
        self.calls = 0

    def step(self, state, actions, turn):
        self.calls += 1
        if self.calls == self.at_step:
            os.kill(os.getpid(), signal.SIGINT)
        return super().step(state, actions, turn)


def test_a_run_with_tools_resumes_exactly(tmp_path):
    straight = tools_trainer(tmp_path / "straight")
    straight.train()
    cut = tools_trainer(tmp_path / "cut", environment=InterruptingTools(at_step=5))  # in step 2 (4 joint actions each)
    cut.train()
    assert cut.global_step == 2
    resumed = tools_trainer(tmp_path / "cut")
    resumed.train(resume_from_checkpoint=True)
    assert_same_run(resumed, straight, tmp_path / "cut", tmp_path / "straight")


def test_lora_agents_with_tools_train_their_adapters_only(tmp_path):
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    agents = [tiny_llama(tokenizer, seed=i) for i in range(2)]
    base = [p.detach().clone() for p in agents[0].parameters()]
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=tokenizer,
        train_dataset=ROWS,
        environment=CountingTools(),
        peft_config=lora(),
        args=small_config(tmp_path, per_device_train_batch_size=2, max_new_tokens=4),
    )
    adapters = {n: p.detach().clone() for n, p in trainer.agents[0].named_parameters() if "lora_B" in n}
    trainer.train()
    trained = dict(trainer.agents[0].named_parameters())
    assert adapters and all(not torch.equal(trained[n], before) for n, before in adapters.items())
    frozen = [p for n, p in trained.items() if "lora_" not in n]
    assert all(torch.equal(a, b) for a, b in zip(frozen, base))
    assert log_lines(tmp_path / "run", "metrics.jsonl")[-1]["agent1/tool_call_frac"] == 1.0


@pytest.mark.skipif(not hasattr(torch, "bfloat16"), reason="no bf16")
def test_bf16_agents_with_tools_train(tmp_path):
    trainer = tools_trainer(tmp_path, precision="bf16", num_train_epochs=1, save_steps=None)
    before = [w.clone() for w in weights(trainer)]
    trainer.train()
    assert all(p.dtype == torch.bfloat16 for p in trainer.agents[0].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(trainer)))
    assert log_lines(tmp_path / "run", "metrics.jsonl")[-1]["agent0/tool_call_frac"] == 1.0
