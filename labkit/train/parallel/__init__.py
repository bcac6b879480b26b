"""The parallelisms as transforms of one model: tensor parallelism (Megatron's f and g around
column- and row-parallel linears), pipeline stages cut from the model's blocks, ZeRO's
sharded units, and context parallelism's ring attention (``ring_attention``, built on the
block pieces of ``attention_blocks``). Strategies compose them; the model registry
(``labkit.train.models``) knows nothing of them.
"""
