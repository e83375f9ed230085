"""Calling the user's joint reward functions and checking what they return."""

from comlrl.rewards.joint_reward import JointReward, RewardBatch

__all__ = ["JointReward", "RewardBatch"]
