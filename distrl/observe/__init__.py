"""What a run shows: progress line, metrics.csv, TensorBoard, and traces of what every process does."""
from distrl.observe.metrics import METRIC_COLUMNS, MetricsLogger
from distrl.observe.trace import Tracer, configure, tracer, write_trace
from distrl.observe.trace_check import validate_trace

__all__ = ["METRIC_COLUMNS", "MetricsLogger", "Tracer", "configure", "tracer", "validate_trace", "write_trace"]
