"""The models the lab trains: the seeded MLP (``labkit.train.training.build_mlp``) and a small GPT.

``labkit.train.models.gpt`` is a decoder-only transformer written so that the parallelisms can be
applied to it piece by piece: tensor parallelism slices its attention heads and MLP columns
(``shard_gpt``), pipeline parallelism cuts its blocks into stages (``GPTStage``), and ZeRO
shards any of its modules' parameters.
"""
