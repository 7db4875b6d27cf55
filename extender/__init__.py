"""The GPU-topology-aware kube-scheduler extender (see DESIGN.md): filter, score, bind."""
