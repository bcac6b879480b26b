"""Notebook widgets: the only place labkit imports ipywidgets (one module per widget)."""
