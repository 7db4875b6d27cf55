"""Plays kube-apiserver, Kueue and kube-scheduler against the two servers, and measures."""
