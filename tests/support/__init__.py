"""Helpers the tests and the bench scripts share (outside ``labkit/``: the package never reads
``solutions/``)."""
