"""Rank-side code of every strategy, one family per subpackage.

A family's ``__init__`` is torch-free: its options dataclass, its metrics record and
``register(Strategy(...))`` (``labkit.config.run.registry`` discovers it); its other modules run
inside the ranks, on ``labkit.train``'s loop and the traced comm of their axes.
"""
