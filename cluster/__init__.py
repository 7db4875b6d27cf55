"""The shared model of the cluster that both servers read it through.

Labels, the node/pod model, conversion from Kubernetes JSON, the watch-fed cache with its
snapshots, and the I/O adapters that feed it. Imports neither server.
"""
