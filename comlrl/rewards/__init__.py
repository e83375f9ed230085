"""Calling the user's joint reward function and checking what it returns."""

from comlrl.rewards.joint_reward import JointReward

__all__ = ["JointReward"]
