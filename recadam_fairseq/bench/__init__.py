"""The optimizer-step benchmark (scripts/benchmark.py, make bench): workloads, implementations, timing, the
report's tables, the end-to-end timer and the command line, one module each."""
