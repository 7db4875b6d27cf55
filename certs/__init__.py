"""Certificates for the webhook and the extender: a CA, serving and client certificates."""
