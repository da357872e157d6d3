"""The documentation site's generated parts (`make docs`, mkdocs.yml): the CLI and config reference from
argparse and the config dataclasses, the benchmark pages from bench/RESULTS.md and bench/results/*.json,
and the checks of the pages' examples. Nothing here is imported by distrl."""
