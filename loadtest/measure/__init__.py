"""How the load test measures: the open-loop request generator, servers as child
processes pinned to a CPU (and what ``/proc`` says of them), and latency statistics.

Layer: I/O (``openloop``, ``pinned``) over PURE arithmetic (``stats``). Shared by the
simulated runs (``loadtest.sim``) and the benchmarks (``loadtest.bench``). Must not decide
what an answer means beyond what its caller accepts, and must not import either of them.
"""
