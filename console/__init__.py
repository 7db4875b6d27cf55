"""``tessera``: the platform team's console over a Tessera cluster (``sinfo``, ``squeue``,
drains and GPU health, ``sbatch`` for Slurm users).

Layers, as in the servers: ``nodes``, ``queues``, ``sbatch``, ``annotate`` and ``render``
are PURE (data in, data out); ``source`` is the I/O edge (a cluster file or the API);
``commands`` ties them per subcommand; ``__main__`` is the ROOT that reads flags and the
environment. The console imports ``cluster`` and the PURE modules of the servers, never
the load test.
"""
