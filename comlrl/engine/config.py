"""What every multi-agent trainer's config shares: schedule, optimisation, sampling, the
rollout tree, the loss normalisation, evaluation and output. Each trainer's config adds the
fields of its own objective and checks them in its ``__post_init__``, after these."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from comlrl.algorithms import JOINT_MODES
from comlrl.engine.config_checks import (
    MAX_COEFFICIENT,
    MAX_NEW_TOKENS,
    PRECISIONS,
    check_bool,
    check_choice,
    check_devices,
    check_int,
    check_learning_rate,
    check_scalar,
    refuse_number_strings,
    unknown_fields_error,
)
from comlrl.engine.optim import LR_SCHEDULES
from comlrl.engine.sharding import SHARDING_MODES
from comlrl.rewards.joint_reward import REWARD_CALLS
from comlrl.rollout.backends import BACKENDS
from comlrl.rollout.sampling import SamplingSpec, check_generation_kwargs
from comlrl.utils.checks import is_real
from comlrl.utils.config_fields import apply_renamed_fields, renamed, respell

JOINT_MODE_SPELLINGS = {"aligned": "aligned", "align": "aligned", "cross": "cross", "crossed": "cross"}
"""Every ``joint_mode`` spelling accepted (any letter case; comlrl 1.4.3's), and what it means."""

PARALLEL_TRAINING_SPELLINGS = {"null": "none"}
"""The other spelling of ``parallel_training="none"`` (any letter case, blanks around it; comlrl 1.4.3's)."""


@dataclass
class TrainerConfig:
    """The fields every trainer's config has. Every field is checked in ``__post_init__``."""

    reference_page: ClassVar[str] = "docs/reference/trainers.md"
    """Where the API reference documents the config's fields (named in the unknown-field error)."""

    absent_fields: ClassVar[dict[str, str]] = {}
    """Fields of other trainers' configs this one lacks because they mean nothing here, and
    why: setting one is an error that says so."""

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainerConfig:
        # Before the dataclass's __init__, whose TypeError would name no field meant.
        unknown = [name for name in kwargs if name not in {spec.name for spec in fields(cls) if spec.init}]
        for name in unknown:
            if name in cls.absent_fields:
                raise ValueError(
                    f"{name}={kwargs[name]!r} has no effect in {cls.trainer_name} ({cls.absent_fields[name]}); drop it"
                )
        if unknown:
            raise unknown_fields_error(cls, unknown)
        return super().__new__(cls)

    # --- schedule -------------------------------------------------------------------------
    num_train_epochs: int = 20
    """Passes over the training dataset."""
    per_device_train_batch_size: int = 2
    """Dataset rows per training step; all their prompts are generated in one batch
    (2 matches the original library's rollout buffer)."""
    train_batch_size: int | None = None
    """Rows per optimizer step: a step's rollout of ``per_device_train_batch_size`` rows is
    shuffled and split into minibatches of this many rows (each row's whole tree in one), one
    optimizer step per agent each, as comlrl 1.4.3 did; ``None``: one minibatch (the whole rollout)."""
    shuffle: bool = True
    """Reshuffle the dataset rows at every epoch (seeded by ``seed``)."""
    seed: int = 42
    """Seeds Python, NumPy and torch (sampling and data order) at the start of ``train()``."""

    # --- optimisation ---------------------------------------------------------------------
    agent_learning_rate: float | list[float] = 5e-6
    """AdamW learning rate: one value for every agent, or a list with one value per agent."""
    lr_scheduler_type: str = "constant"
    """Learning-rate schedule over the run: ``constant``, ``linear`` or ``cosine`` (to 0)."""
    warmup_ratio: float = 0.0
    """Fraction of the optimizer steps over which the learning rate rises linearly from 0."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip each agent's gradient to this global norm; ``None`` turns clipping off."""

    # --- sampling -------------------------------------------------------------------------
    num_generations: int = 4
    """Completions sampled per prompt and agent (the group size G)."""
    max_new_tokens: int = 256
    """Most tokens generated per completion."""
    temperature: float = 0.6
    """Sampling temperature (> 0; the policy's log-probs use the same temperature)."""
    top_p: float = 0.6
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int | None = 50
    """Sample among the k most likely tokens; 0 turns it off; ``None`` leaves it to each
    model's ``generation_config`` (50 unless the model says otherwise), as in comlrl 1.4.3."""
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further ``generate`` keyword arguments the fields above do not cover (e.g.
    ``{"min_new_tokens": 64}``); a key that shadows a field (``temperature``, ``top_p``,
    ``top_k``, ``max_new_tokens``, ``do_sample``, ...) is refused: set the field; so are a value
    of the wrong type or one ``GenerationConfig`` refuses, and (when the trainer is built) a key
    that no ``generate`` argument, ``GenerationConfig`` field or input of the agents' models is."""
    generation_backend: str = "hf"
    """What samples completions: ``hf`` (the training model's own ``generate``) or ``vllm``
    (a vLLM engine per base model on its agent's device, weights copied in after every update;
    needs ``pip install 'comlrl[vllm]'`` on GPUs, vLLM's CPU build on CPUs: docs/guides/distributed.md)."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share in (0, 1) of each GPU's memory that the vLLM engines on it take together, split evenly
    between them (the rest is training's); checked against the free memory at start."""
    compiled_decoding: bool = False
    """``hf``: run each decoding step as one ``torch.compile``-d forward over a KV cache
    allocated once per call (CUDA graphs on a GPU), drawing the same tokens as the eager
    loop; the compile cost is paid once per process and shape bucket. Off by default: on a
    CPU, the benchmarks' two-agent workload ran slower compiled, even past its compile
    (benchmarks/README.md, "Compiled decoding"). Not with ``sharding`` other than
    ``"replicate"`` (refused)."""

    # --- multi-agent structure ------------------------------------------------------------
    num_agents: int | None = None
    """How many agents the trainer must have: checked against the agents it is given or
    loads (comlrl 1.4.3 kept it here); ``None``: the trainer's ``num_agents`` / ``agents`` decide."""
    num_turns: int = 1
    """Turns per episode; above 1 the trainer needs an ``external_transition`` and every joint
    action of a turn starts a branch of the rollout tree."""
    joint_mode: str = "aligned"
    """``aligned``: sample j of every agent forms joint action j (G joint actions per node);
    ``cross``: every combination of the agents' samples (G**N joint actions per node)."""
    early_termination_threshold: float | None = None
    """A node whose mean reward is above this is not expanded to the next turn (its joint
    actions' returns are their rewards); ``None`` expands every node."""
    external_prompt_passthrough: bool = False
    """Use the prompts ``external_transition`` returns as they are; by default each replaces
    the row's ``prompt`` column and goes through that agent's formatter."""
    max_generations_per_step: int = 4096
    """Refuse a config whose rollout tree could sample more completions per step than this
    (all agents and turns, no branch ended early): trees grow as J**turns."""

    # --- rewards --------------------------------------------------------------------------
    reward_call: str = "auto"
    """How reward functions are called: ``batch`` (all joint actions of a turn in one call,
    one list per agent), ``per_joint_action`` (one call per joint action with one-element
    lists, as comlrl 1.4.3 did), ``auto`` (``batch``; a function that returns one value for
    several joint actions is taken for a 1.4.3-style one and called per joint action from
    then on, with a warning)."""
    reward_weights: list[float] | None = None
    """Weight of each reward function when several are given; ``None`` weighs each 1."""

    agent_devices: str | list[str] | None = None
    """Where each agent (and its reference model, unless ``reference_devices`` says otherwise)
    lives: ``None`` leaves them where they are (under torchrun on GPUs: the rank's GPU),
    ``"auto"`` spreads them over the visible GPUs (the CPU without one), one device for all
    (``"cuda:1"``), or a list with one per agent. Agents on different GPUs generate and update
    at the same time; a separate critic goes with its agent (MAAC's with agent 0)."""
    parallel_training: str = "none"
    """comlrl 1.4.3's switch for agents on several devices: ``"mp"`` requires ``agent_devices``
    (agents on different GPUs then generate and update at the same time, as here whenever they
    are placed so); ``"none"``: as ``agent_devices`` says."""
    sharding: str = "replicate"
    """Under torchrun: ``"replicate"`` keeps every agent whole on every rank and sums the
    gradients after the backward pass; ``"full_shard"`` shards each agent's parameters,
    gradients and optimizer state over the ranks (FSDP2, like ZeRO-3: each layer gathered
    for its forward and again for its backward); ``"shard_grad_op"`` keeps each layer
    gathered from its forward to its backward (like ZeRO-2: more memory, one gather fewer).
    Sampling runs on whole weights either way. One process: no effect."""
    precision: str = "fp32"
    """``"bf16"``: the agents (and separate critics) hold bf16 parameters, which sample and
    learn, while the optimizer steps fp32 master weights with fp32 gradients and state; the
    log-probs, loss and value heads stay fp32. ``"fp32"``: the models as given (fp32 unless
    loaded in another dtype)."""
    mixed_precision: str | None = None
    """Replaced by ``precision`` (which no longer autocasts sampling): setting it is an error saying so."""
    disable_dropout: bool = True
    """Turn every dropout of the agents (and critics) off when the trainer is built, as TRL
    does: sampling and the frozen log-probs run in eval mode, the loss's forward in train
    mode, and with dropout on they would be different functions (the first pass's ratio
    would not be 1, the KL to an unchanged reference not 0). False keeps dropout in the loss."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them: less memory for
    about a third more update time."""
    micro_batch_size: int | None = 32
    """Most sequences per forward/backward pass; an agent's sequences of a step are split
    into pieces of this size whose gradients add up to the whole batch's. ``None``: one pass.
    The update's activations grow with it: 8 cut the tutorial example's peak from 9.6 to 7.8
    GiB at the same speed, but made short (64-token) completions 6% slower on a CPU
    (benchmarks/README.md, "Memory")."""
    keep_freed_cpu_memory: bool = True
    """While ``train()`` runs with an agent on the CPU, memory the process frees stays in it
    for the next step's tensors (glibc's allocator: no block by ``mmap``, nothing trimmed;
    given back when ``train()`` returns) instead of coming back as fresh pages that the kernel
    faults in. On a 2-core CPU the second step's update ran a fifth faster, at a peak 2% lower
    on the fixed speed workload and 4% higher on the tutorial example (benchmarks/README.md,
    "Memory"). False, or ``MALLOC_*`` settings in the environment, leave the allocator alone."""

    # --- evaluation -----------------------------------------------------------------------
    eval_interval: int = 16
    """Run ``evaluate()`` before training and every this many steps (0: only after the last
    step); only with an ``eval_dataset``."""
    eval_num_samples: int | None = 4
    """Evaluate the first this many rows of ``eval_dataset`` (``None``: all of them)."""
    eval_batch_size: int = 8
    """Evaluation rows generated together (one ``generate`` call per agent and turn)."""
    eval_do_sample: bool = True
    """Sample evaluation completions with the training settings; False decodes greedily."""

    # --- output ---------------------------------------------------------------------------
    output_dir: str | None = None
    """Where the run writes (``train()`` prints it when it starts; ``TrainResult.output_dir``):
    ``metrics.jsonl``, ``samples.jsonl``, ``checkpoint-{step}/``, ``tensorboard/``. ``None``:
    every ``train()`` writes to a new folder ``comlrl_output/<algorithm>-<YYYYmmdd-HHMMSS>``
    (``comlrl_output/latest`` links to the newest; resuming continues the newest run of the
    trainer's algorithm). A folder named here holds one run at a time: ``train()`` locks it,
    and refuses it when it holds another run unless resuming or overwriting."""
    overwrite_output_dir: bool = False
    """Let a new run replace an earlier run's checkpoints and logs in ``output_dir`` (else it stops)."""
    logging_steps: int = 50
    """Print, and send to W&B / TensorBoard, the metrics averaged over this many training
    steps (``metrics.jsonl`` keeps every step), with samples of the step's completions."""
    num_completions_to_log: int = 4
    """At every logging step, this many joint actions per turn (prompt, each agent's
    completion, reward, return) go to ``output_dir/samples.jsonl`` (and a W&B table, a
    TensorBoard text); 0 logs none."""
    save_steps: int | None = None
    """Write a checkpoint (``output_dir/checkpoint-{step}``: weights, optimizers, schedulers,
    generator states, data position) every this many steps; ``None``: only on SIGINT/SIGTERM."""
    save_total_limit: int | None = None
    """Keep only the newest this many checkpoints; ``None`` keeps all."""
    log_tensorboard: bool = False
    """Also write metrics and samples as TensorBoard events to ``output_dir/tensorboard``
    (needs ``pip install 'comlrl[tensorboard]'``)."""

    # --- older names (accepted with a one-time warning) ---------------------------------------
    learning_rate: float | None = renamed("agent_learning_rate")
    """Old name of ``agent_learning_rate``."""
    actor_learning_rate: float | None = renamed("agent_learning_rate")
    """Old name of ``agent_learning_rate``."""
    rollout_buffer_size: int | None = renamed("per_device_train_batch_size")
    """comlrl 1.4.3's name of ``per_device_train_batch_size`` (prompt groups per rollout)."""
    termination_threshold: float | None = renamed("early_termination_threshold", "docs")
    """The name comlrl's older docs gave ``early_termination_threshold`` (1.4.3 itself refused it)."""

    trainer_name: ClassVar[str] = "this trainer"
    """How errors about this config's fields name its trainer."""
    train_batch_size_counts_rows: ClassVar[bool] = True
    """``train_batch_size`` counts rows of a step's rollout (so at most
    ``per_device_train_batch_size`` of them); MADPO's counts preference pairs."""

    @property
    def centralized(self) -> bool:
        """Whether ONE model writes every role (centralized collaboration; MADPO's and MARLHF's
        ``collaboration_mode="centralized"``, centralized MAGRPO)."""
        return False

    def renamed_advice(self, old_name: str, value: Any) -> str | None:
        """What the warning for comlrl 1.4.3's field ``old_name`` (set to ``value``) tells the
        user to write, where the plain ``write <new name>=<value>`` would not keep its meaning;
        None: that plain advice."""
        return None

    def __post_init__(self):
        refuse_number_strings(self)  # first: every check below compares numbers
        apply_renamed_fields(self)
        for name in (
            "num_train_epochs",
            "per_device_train_batch_size",
            "num_generations",
            "max_new_tokens",
            "num_turns",
            "logging_steps",
            "max_generations_per_step",
            "eval_batch_size",
        ):
            check_int(self, name)
        check_int(self, "num_completions_to_log", minimum=0)
        for name in (
            "micro_batch_size",
            "eval_num_samples",
            "save_steps",
            "save_total_limit",
            "train_batch_size",
            "num_agents",
        ):
            check_int(self, name, allow_none=True)
        check_int(self, "eval_interval", minimum=0, note=" (0: only after training)")
        check_bool(
            self,
            "shuffle",
            "external_prompt_passthrough",
            "eval_do_sample",
            "log_tensorboard",
            "disable_dropout",
            "overwrite_output_dir",
            "compiled_decoding",
            "keep_freed_cpu_memory",
        )
        bounded = self.train_batch_size_counts_rows and self.train_batch_size is not None
        if bounded and self.train_batch_size > self.per_device_train_batch_size:
            raise ValueError(
                f"train_batch_size={self.train_batch_size} is more rows than a rollout holds "
                f"(per_device_train_batch_size={self.per_device_train_batch_size}); it must be at most that"
            )
        respell(self, "parallel_training", PARALLEL_TRAINING_SPELLINGS, strip=True)
        check_choice(self, "parallel_training", ("none", "mp"))
        if self.parallel_training == "mp" and self.agent_devices is None:
            raise ValueError("parallel_training='mp' needs agent_devices: a list with one device per agent (or 'auto')")
        check_int(self, "seed", minimum=0)
        if self.seed >= 2**63 - 2**16:  # torch's generators take 64 bits; ranks add their index
            raise ValueError(f"seed must be below 2**63 - 2**16, got {self.seed!r}")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be at most {MAX_NEW_TOKENS} (2**20), got {self.max_new_tokens!r}")
        rates = self.agent_learning_rate
        if isinstance(rates, list | tuple):
            if not rates:
                raise ValueError("agent_learning_rate is an empty list; give one value, or one per agent")
            for i, rate in enumerate(rates):
                check_learning_rate(rate, f"agent_learning_rate[{i}]")
        else:
            check_learning_rate(rates, "agent_learning_rate")
        check_choice(self, "lr_scheduler_type", LR_SCHEDULES)
        if not (is_real(self.warmup_ratio) and 0 <= self.warmup_ratio < 1):
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.reward_weights is not None and (
            not isinstance(self.reward_weights, list | tuple)
            or not self.reward_weights
            or not all(is_real(w) and math.isfinite(w) for w in self.reward_weights)
        ):
            raise ValueError(
                f"reward_weights must be None or a non-empty list of finite numbers, got {self.reward_weights!r}"
            )
        check_scalar(
            self.weight_decay,
            "weight_decay",
            0,
            MAX_COEFFICIENT,
            why=" (AdamW shrinks each weight by the learning rate times it per step)",
        )
        if self.max_grad_norm is not None and not (is_real(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")
        if not (is_real(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0 (sampling is required), got {self.temperature!r}")
        if not (is_real(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0
        ):
            raise ValueError(f"top_k must be an integer >= 0 or None, got {self.top_k!r}")
        if not isinstance(self.generation_kwargs, dict):
            raise ValueError(f"generation_kwargs must be a dict, got {type(self.generation_kwargs).__name__}")
        check_generation_kwargs(self.generation_kwargs, type(self).__name__)
        SamplingSpec.from_config(self)  # transformers' checks of the whole sampling, not at the first generate
        if self.mixed_precision is not None:
            raise ValueError(
                f"mixed_precision={self.mixed_precision!r} was replaced by precision: write precision='bf16' (bf16 "
                "agents with fp32 master weights) or precision='fp32'"
            )
        check_choice(self, "precision", PRECISIONS)
        check_choice(self, "sharding", SHARDING_MODES)
        if self.sharding != "replicate" and self.compiled_decoding:
            raise ValueError(
                f"compiled_decoding=True is not supported with sharding={self.sharding!r} yet (FSDP's hooks do not "
                "compile into one graph): use sharding='replicate', or drop compiled_decoding"
            )
        if self.early_termination_threshold is not None and not is_real(self.early_termination_threshold):
            raise ValueError(
                f"early_termination_threshold must be a number or None (off), got {self.early_termination_threshold!r}"
            )
        check_devices(self, "agent_devices")
        check_choice(self, "reward_call", REWARD_CALLS)
        respell(self, "joint_mode", JOINT_MODE_SPELLINGS)
        check_choice(self, "joint_mode", JOINT_MODES)
        check_choice(self, "generation_backend", BACKENDS)
        if self.compiled_decoding and self.generation_backend != "hf":
            raise ValueError(
                f"compiled_decoding=True compiles the hf backend's decoding step; generation_backend="
                f"{self.generation_backend!r} runs its own engine: drop compiled_decoding or use 'hf'"
            )
        if self.generation_backend == "vllm" and self.temperature > 2:
            raise ValueError(
                f"temperature={self.temperature!r} is above 2, which vLLM refuses (generation_backend='vllm'): "
                "lower temperature, or use generation_backend='hf'"
            )
        if not (is_real(self.vllm_gpu_memory_utilization) and 0 < self.vllm_gpu_memory_utilization < 1):
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1), got {self.vllm_gpu_memory_utilization!r}")
        if isinstance(self.output_dir, os.PathLike):
            self.output_dir = os.fspath(self.output_dir)
        if self.output_dir is not None and (not isinstance(self.output_dir, str) or not self.output_dir):
            raise ValueError(
                f"output_dir must be a non-empty path string or None (a new folder per run), got {self.output_dir!r}"
            )
