"""What a run shows: progress line, metrics.csv, TensorBoard."""
from distrl.observe.metrics import METRIC_COLUMNS, MetricsLogger

__all__ = ["METRIC_COLUMNS", "MetricsLogger"]
