"""Benchmarks: `python -m bench.throughput`, `python -m bench.solve`. Results in bench/RESULTS.md."""
