"""The one event schema under the name exercises and notebooks import (``labkit.events``);
it lives in ``labkit.base.events``."""

from labkit.base.events import ABORTED, RAW_FIELDS, SCHEMA_VERSION, Event, Lane, Op

__all__ = ["ABORTED", "RAW_FIELDS", "SCHEMA_VERSION", "Event", "Lane", "Op"]
