"""Training on one rank: the loop every strategy stands on, models, data, optimizers,
checkpoints, the single-process reference and the end of a run.
"""
