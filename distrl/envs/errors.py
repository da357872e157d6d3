"""The one error every env-building step raises: a config mistake, named by its key, on one line."""
from __future__ import annotations


class EnvError(ValueError):
    """The configured environment can't be built (unknown id, bad kwargs or wrappers, missing extra)."""


def one_line(e: BaseException, limit: int = 200) -> str:
    """An exception's message on one line (its type's name when it has none), cut to `limit` characters."""
    return " ".join(str(e).split())[:limit] or type(e).__name__
