"""Raw Kubernetes JSON (dicts as orjson returns them) → the records of ``cluster.model``.

Layer: PURE, the whole package. Functions from dicts to frozen dataclasses: no I/O, no
clock, no logging, no pydantic, no cache. Must never raise on a malformed annotation or
resource value: the field is ignored, a line naming the key and the value goes into
``problems``, and the caller (the cache) logs it once. Only an object that cannot be a
node or pod at all (no ``metadata.name``) raises ``ConversionError``.

One module per thing converted, each saying what it decides where a reader might
otherwise have to guess:

* ``grammar``: the grammars of annotation values (GPU index lists, NVLink islands,
  topology constraints and levels, RFC 3339 times), read and written;
* ``raw``: lenient readers of fields of raw objects, and ``ConversionError``;
* ``nodes``: a Node → ``NodeState`` (GPUs, islands, health, resources, taints);
* ``demand``: a pod spec → ``PodDemand``, leniently (``read_demand``) or strictly
  (``pod_demand``, for the webhook);
* ``selection``: where a pod may go (node selector, required node affinity,
  tolerations) → ``NodeSelection``;
* ``pods``: a Pod → ``PodInfo`` (identity, demand, binding, lifecycle).

Nothing is re-exported here: import each name from the module that owns it.
"""
