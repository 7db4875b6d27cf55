"""The real stack on loopback: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager from the pinned binaries, the real Kueue, Tessera's webhook and
extender as processes, fake GPU nodes and a stand-in kubelet, and the install objects
(from ``manifests/`` when they exist, else the YAML files in this folder).

Layer: I/O (processes, sockets, files), under the load test. The end-to-end scenarios
(``tests/e2e``), ``python -m loadtest demo --real`` and ``bench-webhook --against kueue``
stand on it. Nothing here may decide what Tessera should do: the scenarios assert that.
"""
