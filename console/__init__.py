"""``tessera``: the platform team's console over a Tessera cluster (``sinfo``, ``squeue``,
``why``, drains and GPU health, upgrade plans, ``sbatch`` for Slurm users).

Layers, as in the servers: ``nodes``, ``queues``, ``why``, ``upgrade``, ``sbatch``,
``capacity``, ``capacity_walk``, ``shortfall``, ``advice``, ``annotate``, ``render`` and
``output`` are PURE (data in, data out); ``source`` and ``reasons`` are the I/O edge (a
cluster file or the API; the extender's reasons); one ``*_cmd`` module per subcommand
(``nodes_cmd``, ``queues_cmd``, ``capacity_cmd``, ``why_cmd``, ``upgrade_cmd``,
``sbatch_cmd``, ``node_write_cmd``) ties them together; ``__main__`` is
the ROOT that reads flags and the environment. The console imports ``cluster`` and the
PURE modules of the servers, never the load test.
"""
