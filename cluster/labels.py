"""Every label, annotation, resource and scheduler name Tessera reads or writes.

Layer: PURE. Constants only: no imports beyond ``typing``, no logic. The one home for
these strings; a test checks that ``manifests/`` uses exactly these values, so a key
changes here or nowhere.
"""

from typing import Final

# ---------------------------------------------------------------- read from users' objects
QUEUE_NAME: Final[str] = "kueue.x-k8s.io/queue-name"
"""Label on Job/JobSet/Pod: the LocalQueue in the object's namespace."""

PRIORITY_CLASS: Final[str] = "kueue.x-k8s.io/priority-class"
"""Label on Job/JobSet/Pod: the WorkloadPriorityClass; injected from the queue default."""

GANG_MIN: Final[str] = "tessera.dev/gang-min"
"""Annotation: members that must run together (default: all). Also written on templates."""

TOPOLOGY: Final[str] = "tessera.dev/topology"
"""Annotation: ``required:<level>`` or ``preferred:<level>``; copied onto pod templates."""

GPU_PRODUCT: Final[str] = "tessera.dev/gpu-product"
"""Annotation: GPU products the job accepts, ``|``-separated (``H100|A100``)."""

GPU_RESOURCE: Final[str] = "nvidia.com/gpu"
"""Extended resource: whole GPUs (container requests/limits, node allocatable)."""

GPU_MILLI_RESOURCE: Final[str] = "tessera.dev/gpu-milli"
"""Extended resource: a share of one GPU, 1-999 thousandths (GPU sharing)."""

# ---------------------------------------------------------------- written by the webhook
GANG: Final[str] = "tessera.dev/gang"
"""Label on pod templates: gang id ``<namespace>.<job name>``."""

GANG_SIZE: Final[str] = "tessera.dev/gang-size"
"""Annotation on pod templates: members of the gang in total."""

DEFAULT_SCHEDULER_NAME: Final[str] = "tessera-gpu"
"""The kube-scheduler profile that runs the extender; written into pod templates."""

KUEUE_REQUIRED_TOPOLOGY: Final[str] = "kueue.x-k8s.io/podset-required-topology"
"""Pod template annotation: the node label of the level Kueue's topology-aware scheduling
must keep a pod set within; written from ``tessera.dev/topology`` for flavors with a
``spec.topologyName`` (mode B)."""

KUEUE_PREFERRED_TOPOLOGY: Final[str] = "kueue.x-k8s.io/podset-preferred-topology"
"""Pod template annotation: as ``KUEUE_REQUIRED_TOPOLOGY``, but a preference."""

KUEUE_ADMISSION_GATE: Final[str] = "kueue.x-k8s.io/admission"
"""Scheduling gate that keeps a plain Pod suspended until Kueue admits it."""

KUEUE_PROVISIONING_CONTROLLER: Final[str] = "kueue.x-k8s.io/provisioning-request"
"""AdmissionCheck ``controllerName`` of Kueue's ProvisioningRequest check, which asks
Cluster Autoscaler for a workload's nodes before admitting it
(``manifests/autoscaling/``); nothing in Tessera reads it."""

# ---------------------------------------------------------------- written by the extender
GPU_INDICES: Final[str] = "tessera.dev/gpu-indices"
"""Annotation on bound pods: GPU indices taken on the node (``0,1,2,3``; a share: one).
Sent in the Binding's own annotations, which kube-apiserver copies onto the pod as it
binds it: the extender never patches pods."""

RESERVATION: Final[str] = "tessera.dev/reservation"
"""Label and annotation on the extender's Lease of one reservation (in its own
namespace): the label (``"true"``) is what the extender lists to rebuild its
reservations; the annotation says what is held, ``domain=<d>;start=<RFC 3339 or
unknown>;nodes=<n1,n2>`` (``cluster.convert.grammar.format_reservation``)."""

# ---------------------------------------------------------------- read from nodes
GFD_PRODUCT: Final[str] = "nvidia.com/gpu.product"
"""GPU Feature Discovery label: the GPU model (``NVIDIA-H100-80GB-HBM3``)."""

GFD_MEMORY: Final[str] = "nvidia.com/gpu.memory"
"""GPU Feature Discovery label: memory of one GPU in MiB."""

NVLINK_ISLANDS: Final[str] = "tessera.dev/nvlink-islands"
"""Node annotation: GPU indices per NVLink island (``0-3,4-7``); absent: one island."""

UNHEALTHY_GPUS: Final[str] = "tessera.dev/unhealthy-gpus"
"""Node annotation: GPU indices never to use (``5`` or ``1,5``)."""

DRAIN_AFTER: Final[str] = "tessera.dev/drain-after"
"""Node annotation: RFC 3339 time of planned maintenance."""

HOSTNAME: Final[str] = "kubernetes.io/hostname"
"""Well-known node label: the lowest topology level, one domain per node."""

NAMESPACE_NAME: Final[str] = "kubernetes.io/metadata.name"
"""Well-known namespace label carrying the namespace's own name (namespaceSelector)."""

# ---------------------------------------------------------------- queue policy annotations
DEFAULT_PRIORITY_CLASS: Final[str] = "tessera.dev/default-priority-class"
"""LocalQueue/ClusterQueue annotation: priority class injected when a job names none."""

DEFAULT_TIME_LIMIT: Final[str] = "tessera.dev/default-time-limit"
"""LocalQueue/ClusterQueue annotation: ``activeDeadlineSeconds`` injected when absent."""

MAX_TIME_LIMIT: Final[str] = "tessera.dev/max-time-limit"
"""LocalQueue/ClusterQueue annotation: the longest ``activeDeadlineSeconds`` allowed."""

MAX_GPUS_PER_JOB: Final[str] = "tessera.dev/max-gpus-per-job"
"""LocalQueue/ClusterQueue annotation: the most GPUs one workload may ask for."""

FLAVOR_TOPOLOGY: Final[str] = "tessera.dev/topology-name"
"""ResourceFlavor annotation: the Topology whose levels Tessera places gangs by, without
switching on Kueue's topology-aware scheduling (which ``spec.topologyName`` does)."""

DEFAULT_QUEUE: Final[str] = "tessera.dev/default-queue"
"""LocalQueue annotation (``"true"``): the queue for GPU workloads without a queue label."""

# ---------------------------------------------------------------- Kubernetes names we match on
JOB_NAME: Final[str] = "batch.kubernetes.io/job-name"
"""Label the job controller puts on a Job's pods."""

JOB_COMPLETION_INDEX: Final[str] = "batch.kubernetes.io/job-completion-index"
"""Annotation the job controller puts on each pod of an Indexed Job: the pod's index."""

JOBSET_NAME: Final[str] = "jobset.sigs.k8s.io/jobset-name"
"""Label the JobSet controller puts on its Jobs and pods."""

TAINT_NOT_READY: Final[str] = "node.kubernetes.io/not-ready"
"""Taint the node admission plugin adds to new nodes until the kubelet reports Ready."""
