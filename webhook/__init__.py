"""The mutating admission webhook (see DESIGN.md): queue, suspend, priority, flavors, gang.

Layers: ``queues``, ``workload``, ``policy`` and ``patch`` are PURE (the ten rules as
functions over frozen records); ``review`` is the EDGE (AdmissionReview in and out,
validated once); ``review_flow`` joins them without I/O; ``source`` keeps the policy
current (STATE, fed by watches or a file); ``metrics`` is I/O; ``app`` and ``__main__``
are the ROOT. Stands on ``cluster``; imports neither the extender nor the load test.
"""
