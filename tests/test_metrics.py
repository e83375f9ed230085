"""Metric sinks: JSONL always; W&B and TensorBoard only when asked (and only then imported).
The console line and the progress bar say which reward they show; a run whose groups all
have zero spread is measured and warned about.

The W&B and TensorBoard tests write real runs and read them back from disk the way those tools do."""

import json
import struct
import sys

import pytest
import torch

from comlrl.engine.loop import progress_postfix
from comlrl.metrics import JsonlSink, MetricsLogger, TensorBoardSink, WandbSink
from comlrl.metrics.alerts import ZeroSpreadWatch
from comlrl.metrics.rollout import format_metrics, rollout_metrics, zero_spread
from comlrl.rollout import AgentRollout
from comlrl.rollout.tree import RolloutTree, Turn
from comlrl.utils.stats import finish

# Completions are raw model text: newlines, pipes and Markdown characters must survive every sink.
SAMPLES = [
    {"turn": 1, "row": 3, "prompt": "a cat", "agent0_completion": "x | *y*\nz <em>w</em> &amp;", "reward": 0.5},
    {"turn": 1, "row": 4, "prompt": "a dog", "agent0_completion": "w", "answer": "four"},
    {"turn": 2, "row": 4, "prompt": "a dog", "agent0_completion": "v", "answer": 4, "reward": 1.0},
]


class ListSink:
    """A remote sink stand-in (W&B, TensorBoard): what it was handed."""

    def __init__(self):
        self.logged = []

    def log(self, metrics, step):
        self.logged.append((step, metrics))

    def log_samples(self, samples, step):
        pass

    def close(self):
        pass


def test_jsonl_keeps_every_step_and_remote_sinks_get_each_windows_average(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    remote = ListSink()
    logger = MetricsLogger([JsonlSink(str(path)), remote])
    logger.add({"reward/mean": 1.0, "loss": 4.0}, step=1)
    logger.add({"reward/mean": 3.0, "loss": 2.0}, step=2)
    assert remote.logged == []  # nothing averaged before the first flush
    assert logger.flush(step=2) == {"reward/mean": 2.0, "loss": 3.0}
    logger.add({"reward/mean": 5.0}, step=3)
    logger.flush(step=3)
    assert logger.flush(step=3) == {}  # an empty window sends nothing
    logger.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"step": 1, "reward/mean": 1.0, "loss": 4.0},
        {"step": 2, "reward/mean": 3.0, "loss": 2.0},
        {"step": 3, "reward/mean": 5.0},
    ]
    assert remote.logged == [(2, {"reward/mean": 2.0, "loss": 3.0}), (3, {"reward/mean": 5.0})]
    assert not (tmp_path / "run" / "samples.jsonl").exists()  # no samples, no samples file


def test_progress_bar_says_when_the_reward_was_processed():
    scaled = {"reward/mean": 68.25, "reward/raw_mean": 0.6825}
    assert progress_postfix(scaled, ("reward", "reward/mean"), 2) == {
        "epoch": "2",
        "reward": "68.2 (processed)",
        "raw reward": "0.682",
    }
    unprocessed = {"reward/mean": 0.5, "reward/raw_mean": 0.5}
    assert progress_postfix(unprocessed, ("reward", "reward/mean"), 1) == {"epoch": "1", "reward": "0.5"}
    dpo = {"dpo/loss": 0.69, "reward/raw_mean": 0.3}
    assert progress_postfix(dpo, ("loss", "dpo/loss"), 1) == {"epoch": "1", "loss": "0.69"}


def test_jsonl_samples_go_to_their_own_file(tmp_path):
    run = tmp_path / "run"
    logger = MetricsLogger([JsonlSink(str(run / "metrics.jsonl"))])
    logger.log_samples([], step=1)  # nothing to write: no file
    assert not run.exists()
    logger.log_samples(SAMPLES[:2], step=1)
    logger.log_samples(SAMPLES[2:], step=2)
    logger.add({"loss": 1.0}, step=2)
    logger.flush(step=2)
    logger.close()
    lines = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, **SAMPLES[0]}, {"step": 1, **SAMPLES[1]}, {"step": 2, **SAMPLES[2]}]
    assert [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] == [{"step": 2, "loss": 1.0}]

    elsewhere = tmp_path / "other" / "s.jsonl"
    sink = JsonlSink(str(run / "metrics.jsonl"), samples_path=str(elsewhere))
    sink.log_samples(SAMPLES[:1], step=5)
    sink.close()
    assert json.loads(elsewhere.read_text()) == {"step": 5, **SAMPLES[0]}


def test_wandb_missing_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[wandb\]'"):
        WandbSink({"project": "p"}, run_config={})


def test_tensorboard_missing_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # makes `import tensorboard` raise ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)  # so torch imports it again
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[tensorboard\]'"):
        TensorBoardSink("unused")


def read_wandb_records(path):
    """The records of a ``.wandb`` file: a 7-byte W&B header, then a LevelDB log (32 KiB blocks of
    chunks, each a 7-byte header: checksum, length, type) whose records are ``Record`` protobufs."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: the record is complete
            records.append(Record.FromString(pending))
            pending = b""
    return records


def log_two_steps_and_samples(sink):
    """What the real-sink tests read back: steps 1 and 2 (loss at step 1 only), SAMPLES at step 2."""
    logger = MetricsLogger([sink])
    logger.add({"reward/mean": 0.5, "loss": 2.0}, step=1)
    logger.flush(step=1)
    logger.add({"reward/mean": 0.75}, step=2)
    logger.flush(step=2)
    logger.log_samples(SAMPLES, step=2)
    logger.close()


def test_wandb_offline_run_holds_config_metrics_and_samples(tmp_path, monkeypatch):
    """A real offline run (no network, about 3 s): read back its config, history and samples table."""
    import wandb

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(name, value)
    for name in ["WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"]:  # keep the home folder clean
        monkeypatch.setenv(name, str(tmp_path / name))
    log_two_steps_and_samples(
        WandbSink({"project": "p", "dir": str(tmp_path), "config": {"extra": 1}}, run_config={"seed": 3})
    )
    wandb.teardown()  # stops the W&B service process this run started

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    records = read_wandb_records(next(run_dir.glob("*.wandb")))
    (run,) = [r.run for r in records if r.HasField("run")]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert (run.project, config["seed"], config["extra"]) == ("p", 3, 1)

    history = {}
    for record in records:
        if record.HasField("history"):
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    samples = {key[len("samples/") :]: history[2].pop(key) for key in list(history[2]) if key.startswith("samples/")}
    assert history == {1: {"reward/mean": 0.5, "loss": 2.0}, 2: {"reward/mean": 0.75}}
    assert (samples["_type"], samples["nrows"]) == ("table-file", 3)
    table = json.loads((run_dir / "files" / samples["path"]).read_text())
    columns = ["turn", "row", "prompt", "agent0_completion", "reward", "answer"]
    assert table["columns"] == columns
    assert table["data"] == [[sample.get(column) for column in columns] for sample in SAMPLES]


@pytest.mark.filterwarnings("ignore:html5lib's sanitizer is deprecated:DeprecationWarning")
def test_tensorboard_event_files_hold_scalars_and_samples_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugin_util import markdown_to_safe_html
    from tensorboard.util.tensor_util import make_ndarray

    log_two_steps_and_samples(TensorBoardSink(str(tmp_path)))

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {"reward/mean": [(1, 0.5), (2, 0.75)], "loss": [(1, 2.0)]}
    (text,) = events.Tensors("samples/text_summary")
    assert text.step == 2
    shown = markdown_to_safe_html(make_ndarray(text.tensor_proto).item())  # what TensorBoard's Text tab shows
    header = "".join(f"<th>{column}</th>\n" for column in ["turn", "row", "prompt", "agent0_completion", "reward"])
    assert header in shown and shown.count("<tr>") == 4  # the header and one row per sample
    # The completion shows verbatim (its newline as a line break); a missing key is an empty cell.
    assert "<td>x | *y*<br>z &lt;em&gt;w&lt;/em&gt; &amp;amp;</td>\n<td>0.5</td>\n<td></td>" in shown


# ------------------------------------------------------------------ the reward's scale, said
def test_console_line_calls_the_processed_reward_processed():
    scaled = {"reward/mean": 68.25, "reward/raw_mean": 0.6825, "agent0/loss": 0.5, "time/step_s": 2.0}
    assert (
        format_metrics(4, scaled)
        == "step 4 | reward 68.25 (processed) | raw reward 0.6825 | agent0 loss 0.5 | 2.0 s/step"
    )
    same = {"reward/mean": 0.5, "reward/raw_mean": 0.5, "agent0/loss": 0.5}
    assert format_metrics(4, same) == "step 4 | reward 0.5 | agent0 loss 0.5"
    evaluation = {"eval/reward_mean": 50.0, "eval/raw_reward_mean": 0.5, "eval/turn_1/reward_mean": 50.0}
    assert format_metrics(4, evaluation) == (
        "step 4 | eval/reward_mean 50 (processed) | eval/raw_reward_mean 0.5 | eval/turn_1/reward_mean 50"
    )


# ------------------------------------------------------------------ groups with nothing to learn from
def two_agent_tree(rewards):
    """A one-turn aligned tree of 2 agents, 2 rows and G = 2 with ``rewards`` ``(B, J, N)``."""

    def agent():
        return AgentRollout(
            prompt_ids=torch.zeros(4, 1, dtype=torch.long), prompt_mask=torch.ones(4, 1, dtype=torch.long),
            completion_ids=torch.zeros(4, 2, dtype=torch.long), completion_mask=torch.ones(4, 2, dtype=torch.bool),
            texts=["a", "b", "c", "d"], truncated=torch.zeros(4, dtype=torch.bool),
        )  # fmt: skip

    prompts = [["p", "q"], ["p", "q"]]
    turn = Turn(1, [0, 1], prompts, [[["p"], ["p"]], [["q"], ["q"]]], [[[], []], [[], []]], [agent(), agent()],
                rewards, rewards, rewards.unsqueeze(0), children=torch.full((2, 2), -1))  # fmt: skip
    return RolloutTree([turn], torch.arange(2).unsqueeze(1).expand(2, 2), 2, ["score"], transition_calls=0)


def test_zero_spread_groups_by_hand():
    groups = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [0.0, 0.0, -0.0]])
    assert zero_spread(groups).tolist() == [True, False, True]
    tenths = torch.full((1, 3), 0.1, dtype=torch.float64)
    assert tenths.std() > 0 and zero_spread(tenths).tolist() == [True]  # std's rounding is no spread
    assert zero_spread(torch.tensor([[4.0], [5.0]])).tolist() == [True, True]  # one sample: nothing to compare


def test_the_zero_spread_fraction_counts_every_agents_groups():
    # agent 0: row 0 spread [1, 3], row 1 flat [2, 2]; agent 1: both rows flat
    rewards = torch.tensor([[[1.0, 5.0], [3.0, 5.0]], [[2.0, 0.1], [2.0, 0.1]]])  # (B=2, J=2, N=2)
    credits = rewards.permute(2, 0, 1)  # (N, B, G): aligned, joint action j is sample j of each agent
    advantages = [[torch.zeros(4)], [torch.zeros(4)]]
    metrics = finish(rollout_metrics(two_agent_tree(rewards), [rewards], [credits], advantages))
    assert (metrics["agent0/zero_std_group_frac"], metrics["agent1/zero_std_group_frac"]) == (0.5, 1.0)
    assert metrics["reward/zero_std_group_frac"] == 0.75


def test_the_zero_spread_warning_comes_after_patience_flat_steps_and_once():
    flat, learning, dpo = {"reward/zero_std_group_frac": 1.0}, {"reward/zero_std_group_frac": 0.5}, {"dpo/loss": 0.6}
    watch = ZeroSpreadWatch(patience=3)
    # a step with some spread starts the count again; a step that samples nothing does not count
    assert [watch.check(m) for m in [flat, flat, learning, flat, dpo, flat]] == [None] * 6
    warning = watch.check(flat)
    assert warning.startswith("warning: in each of the last 3 steps every group's rewards were all equal")
    for knob in ["reward_func", "num_generations", "temperature"]:
        assert knob in warning
    assert [watch.check(m) for m in [flat, learning, flat, flat, flat]] == [None] * 5  # said once
    # A critic's baseline (or advantage_mode="raw") leaves advantages to learn from: no warning.
    critic = {**flat, "agent0/advantage_mean": 0.0, "agent0/advantage_std": 0.0, "agent1/advantage_mean": -0.3}
    watch = ZeroSpreadWatch(patience=1)
    assert watch.check(critic) is None and watch.check({**critic, "agent1/advantage_mean": 0.0}) is not None
    with pytest.raises(ValueError, match=r"patience must be an int >= 1 \(steps\), got 0"):
        ZeroSpreadWatch(patience=0)
