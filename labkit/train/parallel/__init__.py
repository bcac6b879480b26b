"""The parallelisms as transforms of one model: tensor parallelism (Megatron's f and g around
column- and row-parallel linears), pipeline stages cut from the model's blocks, and ZeRO's
sharded units. Strategies compose them; the model registry (``labkit.train.models``) knows
nothing of them.
"""
