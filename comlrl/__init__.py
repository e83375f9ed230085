"""comlrl: cooperative multi-LLM reinforcement learning."""

__version__ = "0.1.0"
