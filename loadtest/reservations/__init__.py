"""The reservation study: large gangs against a busy cluster of small jobs, on the
openb traces, with and without reservations and backfill (issue 24).

Layer: its own sub-package, above ``inputs`` (a sibling of ``placement``, ``bench`` and
``report``; import contract in ``pyproject.toml``). ``workload`` turns the trace into
jobs with durations, time limits and gangs (PURE); ``cluster`` keeps the simulated
nodes and their free GPUs (PURE state); ``policies`` are the three ways of scheduling
(``none``, ``tessera`` with the extender's own ``extender.reservations``, ``easy``);
``engine`` runs events and measures; ``study`` is the command (I/O + ROOT).
"""
