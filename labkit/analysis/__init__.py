"""Reading recordings: the ``Timeline`` and its summaries, Chrome export, plots,
the FLOP-rate calibration and the run report.
"""
