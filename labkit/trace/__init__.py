"""Recording inside a rank: the tracer, the traced comm layer (the only caller of
``torch.distributed``), and the spool that keeps a failed run's events.
"""
