"""The ten admission rules, one module per concern; ``webhook.admit`` composes them.

Layer: PURE. Plain functions from (workload, policy, config) to a decision: no async, no
I/O, no clock, no settings object, no aiohttp, no pydantic. ``admit`` never raises for
anything a request can contain.

CREATE mutates, UPDATE only validates. Mutation works on a copy-on-write ``Draft`` of the
object: each rule reads the decoded ``Workload`` (the object as the user sent it) and
writes into the draft, keeping every value the user set. The patch is ``diff(original, copy)``
(``webhook.patch``). Every rule is idempotent: ``admit`` applied to its own output
changes nothing, which is what kube-apiserver's ``reinvocationPolicy: IfNeeded`` needs.

The rules, in the order they run (the first denial wins), for every workload but those
the Job and JobSet controllers made, which are let through as they are: a controller
ownerReference, from that controller's username, to an owner that exists with that uid
(``webhook.owners``; any other ownerReference changes nothing):

1. ``rule_queue``: the ``kueue.x-k8s.io/queue-name`` LocalQueue, or the namespace's
   default queue for a GPU workload with no label.
2. ``rule_suspend``: ``spec.suspend: true`` (Job, JobSet), or the Kueue scheduling gate
   (Pod).
3. ``rule_priority``: the WorkloadPriorityClass label, defaulted from the queue.
4. ``rule_flavors``: the queue's GPU flavors the job accepts (and where the queue could
   get some of every GPU resource it asks for); their node labels as a required node
   affinity (ORed across flavors, ANDed with the user's) and tolerations of their
   taints, on the pod templates that use GPUs. Never ``nodeSelector``: Kueue writes that
   at admission.
5. ``rule_quota``: the GPUs asked for against the most the queue could ever get.
5b. ``rule_namespace_quota``: the whole GPUs and pods asked for against the
   namespace's ResourceQuotas, which still apply after Kueue admits (a denial when one
   could never hold them); a warning when a quota is below the queue's nominal GPUs.
6. ``rule_gang``: gang id, size and minimum on every pod template of a multi-pod
   workload; a gang-min below the size must fit the quota on its own (all pods
   together are rule 5's).
7. ``rule_topology``: ``tessera.dev/topology`` names a level of the flavors' Topology;
   copied onto pod templates (mode A), or handed to Kueue as its pod-set annotation
   (mode B). In mode A, a gang whose level is required also gets a required pod affinity
   to its own gang at the level's node label.
8. ``rule_time_limit``: ``activeDeadlineSeconds`` defaulted and bounded by the queue.
9. ``rule_scheduler``: ``schedulerName`` of the extender's profile.

Decisions a reader might otherwise have to guess:

* GPU product matching (rule 4): a product the job accepts (``H100``) matches a
  flavor's ``nvidia.com/gpu.product`` label (``NVIDIA-H100-80GB-HBM3``, as GPU Feature
  Discovery writes it) when its ``-``-separated parts appear as consecutive parts of the
  label, case-insensitively: ``h100``, ``H100-80GB`` and the full label match it;
  ``H10`` and ``A100`` do not. A flavor without the label matches no named product.
* Node affinity (rule 4): required node-affinity terms are ORed and the expressions
  inside a term ANDed, so (user terms) AND (flavor A OR flavor B) is every user term
  ANDed with each flavor term. A user term that already contains every expression of
  some flavor term already implies the flavors and is kept as it is; that is also what
  makes a second pass change nothing. An empty user term matches no node and stays
  empty. A flavor with no node labels may run anywhere, so then no affinity is added.
* Tolerations (rule 4): one per taint in the allowed flavors' ``nodeTaints`` that no
  existing toleration tolerates. The flavors' ``spec.tolerations`` are Kueue's to add
  when it admits the workload to one flavor.
* Gang id (rule 6): ``<namespace>.<name>``. A ``generateName`` object has no name at
  admission, so its id is ``<namespace>.<generateName><5 characters>``, the characters
  drawn from a SHA-256 of the admission request's uid in the alphabet Kubernetes uses
  for generated names: unique (request uids are), and stable across reinvocation
  because an existing ``tessera.dev/gang`` label, on the object or on a template, is
  never rewritten. An id longer than a label value may be (63) keeps its first 57
  characters and ends in ``-`` and 5 characters from a hash of the whole id.
* Scheduler (rule 9): kube-apiserver defaults ``schedulerName`` to ``default-scheduler``
  before admission, so that value counts as "not chosen" and is replaced.
* Time limit (rule 8): the limit of a Job is its ``spec.activeDeadlineSeconds``, of a
  JobSet each replicated Job's, of a Pod its own. The same value is also written into
  pod templates that have none, because the extender only sees pods and needs it to
  keep jobs off nodes that drain before the limit ends. With no default but a maximum,
  the maximum is the default (a job without a limit would break the maximum).
* Gang pod affinity (rule 7): ``{"labelSelector": {}, "matchLabelKeys":
  ["tessera.dev/gang"], "topologyKey": <the level's node label>}`` appended to each
  template's required ``podAffinity`` terms (the user's kept, ANDed; not written twice),
  for a workload of more than one pod, all of which ask for GPUs, whose template's
  topology is ``required:<level>``, when every allowed flavor that names a Topology maps
  the level to the same node label. kube-scheduler then itself refuses nodes outside the
  domain of the members already placed, so that its sample of nodes for the extender
  holds the gang's domain; the extender still chooses the domain of the first member. A
  preference gets none (it would turn into a rule), and neither does mode B (Kueue writes
  node selectors), nor a gang with a member without GPUs (the extender never places it,
  yet the affinity would follow it). Why the selector is empty: ``gang_affinity``.
* Quota (rule 5): counted per GPU resource: whole GPUs against ``nvidia.com/gpu``
  quota, shares (milli) against ``tessera.dev/gpu-milli`` quota. The job fits when one
  allowed flavor can hold all of it.

Modules: ``outcome`` (the settings the rules read and the decisions they make),
``queue`` (rules 1, 2, 3, 8, 9: queue, suspend, priority, time limit, scheduler),
``placement`` (rules 4 and 7: flavors, node affinity, tolerations, topology), ``gang``
(rules 5 and 6: quota, gang metadata, and the gang id written last) and ``namespace``
(rule 5b: ResourceQuotas).
"""
