"""How many times each stored item is sampled: a sample-to-insert ratio held within an error buffer.

Reverb's `SampleToInsertRatio` semantics, on counts of items (transitions, or
sequences): with r samples per insert, min_size and error buffer e,

    diff = inserts * r - samples,   offset = r * min_size,
    sampling n more is allowed while   inserts >= min_size  and  diff - n >= offset - e,
    inserting n more is allowed while  inserts < min_size  or  diff + n * r <= offset + e.

So the learner never runs more than e samples ahead of the ratio (it blocks),
and the workers never run more than e samples ahead of the learner (they block).
Workers insert a fragment's items at once, so the driver lets them sample while one
more item fits; the overshoot is at most one gather. Neither side can then block
forever while the other can move, provided 2e >= r + (items in one sample)
(`deadlock_free`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class RateLimiter:
    samples_per_insert: float
    min_size: int
    error_buffer: float
    inserts: int = 0
    samples: int = 0

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    @property
    def offset(self) -> float:
        return self.samples_per_insert * self.min_size

    def can_sample(self, n: int) -> bool:
        return self.inserts >= self.min_size and self.diff - n >= self.offset - self.error_buffer

    def can_insert(self, n: int) -> bool:
        # Below min_size the learner cannot sample yet, so refusing an insert would block both sides.
        return self.inserts < self.min_size or self.diff + n * self.samples_per_insert <= self.offset + self.error_buffer

    def sample_allowance(self) -> int:
        """Items the learner may sample now without running ahead of the ratio by more than the buffer."""
        if self.inserts < self.min_size:
            return 0
        return max(0, math.floor(self.diff - self.offset + self.error_buffer))

    def observed_ratio(self) -> float | None:
        """Samples per insert past min_size, so far."""
        past = self.inserts - self.min_size
        return self.samples / past if past > 0 else None

    @staticmethod
    def deadlock_free(samples_per_insert: float, error_buffer: float, sample_items: int) -> bool:
        """Whether one side can always move while the other is blocked (see the module docstring)."""
        return error_buffer >= RateLimiter.smallest_error_buffer(samples_per_insert, sample_items)

    @staticmethod
    def smallest_error_buffer(samples_per_insert: float, sample_items: int) -> float:
        """The least error buffer that is `deadlock_free` for these ratio and sample sizes."""
        return (samples_per_insert + sample_items) / 2
