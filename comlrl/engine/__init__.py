"""The engine: the trainer machinery every algorithm family shares, apart from the families
(``comlrl/trainers/``: each a config plus its objective and trainer). Nothing here imports a
family; the families import from here. Its public names are exported by ``comlrl.trainers``
and ``comlrl`` (``MultiAgentTrainer``, ``TrainerConfig``, ``TrainResult``).

- ``base``: :class:`~comlrl.engine.base.MultiAgentTrainer`, the engine every trainer is
  (one constructor, ``train``, ``evaluate``, ``save_model``).
- ``setup``: how a trainer is built, in order (parts, centralized set-up, agents, rewards,
  prompts, learners, data parallelism).
- ``inputs``: :class:`~comlrl.engine.inputs.TrainerInputs`, what a trainer is given besides
  its config, declared once.
- ``parts``: the parts an algorithm is made of (objective, reward source, schedule).
- ``config`` and ``config_checks``: :class:`~comlrl.engine.config.TrainerConfig`, the fields
  every trainer's config shares, and the checks the configs are built from.
- ``policy_gradient`` and ``policy_gradient_config``: the policy-gradient objective and its
  config fields, shared by the REINFORCE family, the actor-critic trainers and MARLHF.
- ``loop``: the training loop and :class:`~comlrl.engine.loop.TrainResult`.
- ``agents``: :class:`~comlrl.engine.agents.Agents`, the agents' models, tokenizers, adapters,
  references, devices and modes.
- ``update``: one update, every learner's optimizer steps on a step's rollout tree.
- ``evaluation``: a trainer's evaluation episodes.
- ``centralized``: centralized collaboration (one model writes every role), its comparator
  adapters and set-up, used by centralized MAGRPO, MADPO and MARLHF.
- ``optim``: :class:`~comlrl.engine.optim.Learners`, one optimizer and schedule per agent
  (and critic).
- ``master_weights``: fp32 master weights of bf16 parameters (``precision="bf16"``).
- ``distributed``: data parallelism across torchrun ranks.
- ``sharding``: FSDP2-sharded agents (``sharding="full_shard"``/``"shard_grad_op"``), also used
  by :mod:`comlrl.models`, :mod:`comlrl.rollout` and :mod:`comlrl.checkpoint`.
"""
