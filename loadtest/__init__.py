"""Plays kube-apiserver, Kueue and kube-scheduler against the two servers, and measures.

The top layer (import-linter): it may import both servers and ``cluster``, and nothing
imports it. Its arithmetic (``fgd``, ``stats``, ``scheduling``, ``kueue``, ``fleet``,
``trace_input``) is PURE; the simulators, benchmarks and reports do the I/O.
"""
