"""The benchmarks: each server pinned to one core and driven open loop, measured against a
baseline server in the same run (``bench-webhook``, ``bench-webhook --against kueue``,
``bench-extender``, ``overload``), and in-process micro-benchmarks (``cache``,
``review_cpu``).

Layer: ROOT scripts (read argv, start processes, print tables) over I/O helpers
(``review_steps``). Must not be imported by the servers or run by pytest (except the
tests of their arithmetic and the e2e test that runs ``--against kueue``), and must not
change what they measure: figures are quoted as ratios to the baseline of the same run.
"""
