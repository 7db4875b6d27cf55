"""The simulated control plane: kube-apiserver, Kueue, the Job controller, kube-scheduler
and the kubelets, played in one asyncio loop against the two servers' real endpoints
(``python -m loadtest demo | latency | soak``).

Layer: I/O (``apiserver``, ``cluster_sim``, ``targets``, ``remote_pods``, ``verb_rate``)
standing on PURE rules (``objects``, ``kueue``, ``scheduling``), wired by ``scenario``.
Must not import the servers' code: it talks to them over the wire only, so that it
measures what a cluster sees; and must not print or report (``loadtest.report`` does).
"""
