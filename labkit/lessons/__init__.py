"""Lesson drivers: experiments that call ``labkit.run`` / ``labkit.launch`` and shape
what a notebook shows. Nothing here runs inside a rank.
"""
