"""Placement quality the FGD way (``python -m loadtest placement``, or ``python -m
loadtest.placement``): Tessera's scoring against published baselines on the openb traces.

Layer: PURE arithmetic (``fgd``) under an I/O + ROOT harness that reads the traces and
prints tables. Tessera's decisions are the extender's own PURE code, called directly;
must not re-implement them, and no policy may know which trace it runs on.
"""
