"""Certificates for the webhook and the extender: a CA, serving and client certificates.

``python -m certs`` (ROOT, ``__main__``) wires ``plan`` (PURE: validated flags), ``issue``
(PURE: keys and certificates), ``renew`` (PURE: keep or re-issue, given the files and
``now``), ``manifests`` (PURE: caBundle text edit) and ``store`` (I/O: atomic writes).
A standalone tool: imports neither server nor the load test.
"""
