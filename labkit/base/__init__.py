"""Foundation: errors, the event schema, input validation, devices, the rank grid.

Torch-free; imports nothing else of labkit.
"""
