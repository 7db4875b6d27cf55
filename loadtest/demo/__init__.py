"""The demo and the load-test modes that run the whole cluster: ``make demo``, ``latency``
and ``soak`` on the simulated control plane, ``demo --real`` on the real stack, and the
server-less ``selfcheck``.

Layer: ROOT (chooses each run's shape, runs it, prints and writes its reports) over the
I/O of the real demo's driver. Must not read the environment (``loadtest.__main__``
does), and must not admit, unsuspend or place anything itself.
"""
