"""Starting ranks: the supervisor, the fork server, the warm pool, torchrun, emulated
nodes and Ray Train, and the ``RunResult`` they all return.
"""
