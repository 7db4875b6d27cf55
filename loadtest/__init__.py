"""Plays kube-apiserver, Kueue and kube-scheduler against the two servers, and measures.

The top layer (import-linter): it may import both servers and ``cluster``, and nothing
imports it. Inside, one sub-package per job, in layers (a contract in ``pyproject.toml``):

* ``__main__`` and ``cli``: ``python -m loadtest`` and its flags (ROOT);
* ``demo``: the modes that run a whole cluster (``demo``, ``latency``, ``soak``,
  ``demo --real``, ``selfcheck``) (ROOT);
* ``report``, ``bench``, ``placement``, ``reservations``: the reports (PURE), the
  benchmarks (ROOT scripts), the FGD placement study, the reservation study (gangs with
  and without ``extender.reservations``); none of them imports another;
* ``sim``: the simulated control plane (I/O over PURE rules);
* ``inputs``, ``measure``, ``stack``: fleets and traces (PURE), the open-loop generator,
  pinned processes and statistics, and the real control plane on loopback (I/O).

Each module says its layer and what it must not do. Nothing here may decide what the
servers decide: it measures them over the wire, or calls their PURE code as they do.
"""
