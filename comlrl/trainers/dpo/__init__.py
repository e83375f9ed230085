"""Direct preference optimization of the agents: MADPO (DPO on pairs of the agents' own joint
actions, ranked by the task reward) and MADPOIter (MADPO in rounds, each on fresh pairs of the
current policy against a comparator policy). The pairs (pairs.py), the rounds (rounds.py),
the comparators (comparators.py, api_comparator.py, joint_comparator.py), the replay of
earlier rounds' pairs (replay.py) and their reward histograms are here; MARLHF
(:mod:`comlrl.trainers.rlhf`) fits its reward model to the same pairs."""

from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.iterative import MADPOIterConfig, MADPOIterTrainer
from comlrl.trainers.dpo.madpo import MADPOTrainer
from comlrl.trainers.dpo.pairs import PreferencePair

__all__ = ["MADPOConfig", "MADPOIterConfig", "MADPOIterTrainer", "MADPOTrainer", "PreferencePair"]
