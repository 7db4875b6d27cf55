"""The GPU-topology-aware kube-scheduler extender (see DESIGN.md): filter, score, bind.

Layers: ``config``, ``context``, ``gpus``, ``filters``, ``gangs``, ``scores`` and
``decide`` are PURE (frozen data in, verdicts and scores out); ``memo`` is the STATE
they carry between requests (one decision cache per config, no I/O); ``wire`` is the
EDGE (the ``extender/v1`` JSON shapes, validated once); ``verbs`` joins them per
endpoint without I/O; ``binder``, ``binding`` (carrying out a planned bind),
``learning`` (the config in use and its pod mix) and ``metrics`` are I/O; ``app`` and
``__main__`` are the ROOT. Stands on ``cluster``; imports neither the webhook nor the
load test.
"""
