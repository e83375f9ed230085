"""Preference-based multi-agent trainers: MADPO (DPO on pairs of the agents' own joint actions)
and MADPOIter (MADPO in rounds, against a comparator policy); MARLHF (a joint reward model fitted
to such pairs, then online RL on its scores) and MARLHFIter (MARLHF in rounds). The centralized
adapters are here too, as in comlrl 1.4.3 (they live in :mod:`comlrl.trainers.reinforce.centralized`)."""

from comlrl.trainers.loop import TrainResult
from comlrl.trainers.preference.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.config import MADPOConfig
from comlrl.trainers.preference.iterative import MADPOIterConfig, MADPOIterTrainer
from comlrl.trainers.preference.madpo import MADPOTrainer
from comlrl.trainers.preference.marlhf import JointRewardModel, MARLHFConfig, MARLHFTrainer
from comlrl.trainers.preference.marlhf_iter import MARLHFIterConfig, MARLHFIterTrainer
from comlrl.trainers.preference.pairs import PreferencePair

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "PreferencePair",
    "TaggedCentralizedComparatorAdapter",
    "TrainResult",
]
