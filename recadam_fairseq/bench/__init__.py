"""Measure what a method costs. The optimizer-step benchmark (scripts/benchmark.py, make bench): workloads,
implementations, timing, the report's tables, the end-to-end timer and the command line, one module each; beside it
the costs in fairseq-train and of a model's state, each the code of the script of its name: ``bench_methods`` (a set
of methods against each one's base), ``bench_r3f``, ``bench_sharding``, ``ca_mtl_overhead``, ``e2e_overhead`` (the
GPU pass, scripts/gpu/), with ``bench_rows``, each method's rows in those benchmarks and the GPU pass."""
