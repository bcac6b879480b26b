"""Conceptual diagrams: the picture of a mechanism a lesson draws *before* its first
measurement (the ring's steps, DP replicas, the TP column/row split with shapes, a pipeline's
stages, ZeRO's partitions, the parameter server, the 3D grid). Drawn from the same numbers
the lesson then runs with, returned as matplotlib Figures, one module per mechanism.
"""
