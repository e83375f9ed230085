"""Preference-based multi-agent trainers: MADPO (DPO on pairs of the agents' own joint actions)."""

from comlrl.trainers.loop import TrainResult
from comlrl.trainers.preference.config import MADPOConfig
from comlrl.trainers.preference.madpo import MADPOTrainer
from comlrl.trainers.preference.pairs import PreferencePair

__all__ = ["MADPOConfig", "MADPOTrainer", "PreferencePair", "TrainResult"]
