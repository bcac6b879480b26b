"""Lesson figures and animations driven by recorded runs (one module per lesson topic).

Every function returns a matplotlib ``Figure`` (or an animation / HTML string) and never
calls ``plt.show()``; widgets that wrap them live in ``labkit.widgets``.
"""
