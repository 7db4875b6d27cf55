"""What a load-test run is fed: the synthetic HGX fleet and job stream, the teams' Kueue
objects, real node lists and the Alibaba traces turned into the API's JSON.

Layer: PURE, except ``traces``, which reads the shared CSV files. Must not decide anything
the servers or the simulated control plane decide, and must not start, send or measure
anything: the simulator (``loadtest.sim``), the placement study and the benchmarks do.
"""
