"""``python -m loadtest sched-perf``: what the extender costs a real kube-scheduler.

Layer: the studies' layer of the load test (beside ``bench``, ``placement`` and
``reservations``), over the real stack (``loadtest.stack``), the traces
(``loadtest.inputs``) and the measuring tools (``loadtest.measure``). The same pods on
fresh, identical control planes, scheduled by three kube-scheduler profiles: in-tree with
GPU packing, in-tree default, and the shipped ``tessera-gpu`` profile with the extender.
Must not change what the servers decide: it only starts them and watches the API.
"""
