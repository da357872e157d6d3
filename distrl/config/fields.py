"""The config's building block: a dataclass field that carries its doc and its valid range."""
from __future__ import annotations

from dataclasses import field
from typing import Any

MODES = ("single", "sync", "async")

# Upper bounds of time fields: Ray's waits take milliseconds as a 64-bit int, and a larger wait or interval
# than these is a typo rather than a plan.
WEEK_S = 7 * 24 * 3600.0
YEAR_S = 365 * 24 * 3600.0


class ConfigError(ValueError):
    """A user mistake in a config file, an override or a flag."""


def f(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
      choices: tuple | None = None, lo_open: bool = False, item_lo: int | None = None, min_items: int = 1) -> Any:
    """A dataclass field with its doc and the range `_check_range` enforces (`item_lo`: a list of at least
    `min_items` ints, each >= item_lo and, given `hi`, <= hi)."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open, "item_lo": item_lo,
            "min_items": min_items}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
