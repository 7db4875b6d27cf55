"""What a run found, for people: summaries for the terminal, JSON documents and
self-contained HTML pages with inline SVG charts, for the simulated runs, the real-stack
demo and the placement study.

Layer: PURE. Numbers and records in, text out: no I/O, no clock (the callers write the
files). Must not change the results it reports on, nor import the runners that made them
beyond their result types.
"""
