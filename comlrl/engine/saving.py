"""A run's trained models on disk: ``save_model``'s folders, and the models and part files of
a checkpoint, written and read back."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Protocol

from comlrl.checkpoint import write_folders
from comlrl.engine.agents import Agents
from comlrl.engine.distributed import DataParallel
from comlrl.engine.optim import Learners
from comlrl.rollout.backends import GenerationBackend, sync_every_agent

Writer = tuple[str, Callable[[str], None]]
"""A folder name in a checkpoint (or ``save_model``'s folder) and what writes it."""


class SavedPart(Protocol):
    """What a part keeps on disk (:class:`~comlrl.engine.parts.Part`'s hooks)."""

    def writers(self) -> list[Writer]: ...

    def write_checkpoint(self, folder: str) -> None: ...

    def load(self, path: str) -> None: ...


class SavedObjective(SavedPart, Protocol):
    """An objective, which may keep something in each agent's folder too."""

    def write_with_agent(self, agent: int, folder: str) -> None: ...


class RunModels:
    """The ``agents`` of a run and what its parts keep beside them (critics, the reward model;
    in checkpoints only: MADPO's pairs, the rounds)."""

    def __init__(
        self,
        agents: Agents,
        learners: Learners,
        parallel: DataParallel,
        backend: GenerationBackend,
        objective: SavedObjective,
        others: Sequence[SavedPart],
    ):
        self.agents, self.learners, self.parallel, self.backend = agents, learners, parallel, backend
        self.objective, self.others = objective, list(others)

    def save(self, output_dir: str, merge_adapters: bool = False) -> list[str]:
        """Every trained model into ``output_dir`` (``MultiAgentTrainer.save_model`` says how)."""
        self.learners.require_finite(f": {output_dir} was not written")
        with self.agents.whole_weights(merge_adapters):
            if not self.parallel.is_main:
                return []
            return write_folders(output_dir, self.writers(merge_adapters))

    def writers(self, merge_adapters: bool = False) -> list[Writer]:
        """Folder name and writer of every trained model, for ``save`` and checkpoints."""
        agents = [
            (f"agent_{i}", functools.partial(self.write_agent, i, merge_adapters=merge_adapters))
            for i in range(len(self.agents))
        ]
        return agents + [writer for part in (self.objective, *self.others) for writer in part.writers()]

    def write_agent(self, agent: int, folder: str, merge_adapters: bool = False) -> None:
        """Agent ``agent``'s weights (or adapter) and tokenizer into ``folder``, with what its
        objective keeps there (a value head on the agent)."""
        self.agents.write(agent, folder, merge_adapters)
        self.objective.write_with_agent(agent, folder)

    def write(self, folder: str) -> None:
        """Every trained model of a checkpoint into ``folder`` (``agent_{i}/``, ...), and what
        the parts keep in a checkpoint only (MADPO's pairs, the rounds)."""
        for name, write in self.writers():
            write(os.path.join(folder, name))
        for part in (*self.others, self.objective):
            part.write_checkpoint(folder)

    def load(self, path: str) -> None:
        """The weights :meth:`write` wrote into checkpoint ``path``, loaded in place, and handed
        to the generation backend (an engine of its own would sample the old ones)."""
        self.agents.load(path)
        for part in (self.objective, *self.others):
            part.load(path)
        sync_every_agent(self.backend, len(self.agents))
