"""``tessera sbatch``: a Slurm batch script's ``#SBATCH`` directives as an Indexed Job.

Layer: PURE. Text in, a Job object (a dict, as ``kubectl apply`` would send it) out: no
I/O, no clock, no settings. Must refuse, naming it, every directive it cannot honour:
a job that silently lost a ``--exclusive`` or ``--dependency`` would run, just not as
its author meant.

Directives are read as ``sbatch`` reads them: ``#SBATCH`` lines at the top of the script,
until the first line that is neither a comment nor blank; several options may share a
line; long options as ``--opt=value`` or ``--opt value``, short ones as ``-N 2`` or
``-N2``. The translation:

=====================  =============================================================
``-J``/``--job-name``  the Job's name (made a DNS label: lower case, ``-`` for others)
``-p``/``--partition`` the LocalQueue (``kueue.x-k8s.io/queue-name``) through the
                       ``--queue-map``, else a queue of the partition's own name
``-N``/``--nodes``     ``completions`` = ``parallelism`` (one pod per node, Indexed)
``--ntasks-per-node``  ``SLURM_NTASKS_PER_NODE`` in the pod; CPUs are multiplied by it
``--gres=gpu[:type]:N`` ``nvidia.com/gpu: N`` per pod; a type becomes
                       ``tessera.dev/gpu-product`` (``gpu:h100:8`` → ``h100``)
``-t``/``--time``      ``activeDeadlineSeconds`` of the Job
``-c``/``--cpus-per-task`` ``cpu`` requests (times tasks per node)
``--mem``              ``memory`` per pod: Slurm's MB by default, ``K M G T`` suffixes
=====================  =============================================================

The script runs as ``bash -c`` in one container with the Slurm variables a script
commonly reads (``SLURM_JOB_NAME``, ``SLURM_NNODES``, ``SLURM_NODEID`` from the pod's
completion index, ``SLURM_NTASKS_PER_NODE``, ``SLURM_CPUS_PER_TASK``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels

MAX_NAME: Final = 52
"""A Job name longer than this leaves its pods no room for the index suffix within 63."""


class SbatchError(ValueError):
    """The script cannot become a Job; the message names every directive at fault."""


_LONG: Final = {
    "job-name": "job_name",
    "partition": "partition",
    "nodes": "nodes",
    "ntasks-per-node": "ntasks_per_node",
    "gres": "gres",
    "time": "time",
    "cpus-per-task": "cpus_per_task",
    "mem": "mem",
}
_SHORT: Final = {
    "J": "job_name",
    "p": "partition",
    "N": "nodes",
    "t": "time",
    "c": "cpus_per_task",
}
_DNS: Final = re.compile(r"[^a-z0-9-]+")
_MEM: Final = re.compile(r"([0-9]+)([KMGTkmgt]?)[Bb]?")
_GRES: Final = re.compile(r"gpu(?::([A-Za-z0-9._-]+))?:([0-9]+)")
_QUEUE: Final = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class Directives:
    """What the ``#SBATCH`` lines asked for; None: not given."""

    job_name: str | None = None
    partition: str | None = None
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    time_s: int | None = None
    cpus_per_task: int | None = None
    memory: str | None = None
    """A Kubernetes quantity (``64Gi``)."""


def parse_slurm_time(text: str) -> int | None:
    """Seconds from Slurm's ``--time``: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``; None for no limit (``0``, ``UNLIMITED``, ``INFINITE``).
    ``ValueError`` for anything else."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days = 0
    rest = value
    if "-" in value:
        day_text, rest = value.split("-", 1)
        if not day_text.isdigit():
            raise ValueError(f"{text!r} is not a Slurm time")
        days = int(day_text)
    parts = rest.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(
            f"{text!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
        )
    numbers = [int(p) for p in parts]
    if "-" in value:
        hours, minutes, seconds = [*numbers, 0, 0][:3]
    elif len(numbers) == 3:
        hours, minutes, seconds = numbers
    else:
        hours, minutes, seconds = 0, numbers[0], numbers[1] if len(numbers) == 2 else 0
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None


def _positive(option: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{option}={value!r} is not a positive whole number")
    return int(value)


def _memory(value: str) -> str:
    match = _MEM.fullmatch(value.strip())
    if match is None or int(match[1]) < 1:
        raise ValueError(f"--mem={value!r} is not a size like 4000, 64G or 512M")
    unit = (match[2] or "M").upper()
    return f"{match[1]}{'' if unit == 'B' else unit + 'i'}"


def _directive_lines(script: str) -> list[str]:
    lines = script.splitlines()
    found: list[str] = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if number == 0 and stripped.startswith("#!"):
            continue
        if stripped.startswith("#SBATCH"):
            found.append(stripped[len("#SBATCH") :])
        elif stripped and not stripped.startswith("#"):
            break
    return found


def _options(line: str) -> list[tuple[str, str | None]]:
    """(option as written, value or None) for each option of one ``#SBATCH`` line."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as exc:
        raise SbatchError(f"#SBATCH{line}: {exc}") from None
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            name, sep, value = word.partition("=")
            takes = name[2:] in _LONG
            if not sep and takes and i + 1 < len(words):
                i += 1
                value, sep = words[i], "="
            options.append((name, value if sep else None))
        elif word.startswith("-") and len(word) >= 2:
            name = word[:2]
            value = word[2:]
            if not value and name[1] in _SHORT and i + 1 < len(words):
                i += 1
                value = words[i]
            options.append((name, value or None))
        else:
            options.append((word, None))
        i += 1
    return options


def parse_directives(script: str) -> Directives:
    """The ``#SBATCH`` directives of ``script``; ``SbatchError`` names every one that is
    unsupported or malformed."""
    values: dict[str, str] = {}
    faults: list[str] = []
    for line in _directive_lines(script):
        for option, value in _options(line):
            key = _LONG.get(option[2:]) if option.startswith("--") else _SHORT.get(option[1:])
            if key is None:
                faults.append(f"#SBATCH {option} is not supported by tessera sbatch")
            elif value is None or value == "":
                faults.append(f"#SBATCH {option} needs a value")
            else:
                values[key] = value
    if faults:
        raise SbatchError("; ".join(faults))
    try:
        return _directives(values)
    except ValueError as exc:
        raise SbatchError(str(exc)) from None


def _directives(values: Mapping[str, str]) -> Directives:
    gpus, gpu_type = 0, None
    if "gres" in values:
        match = _GRES.fullmatch(values["gres"].strip())
        if match is None:
            raise ValueError(
                f"--gres={values['gres']!r}: only GPUs are supported, as gpu:N or gpu:TYPE:N"
            )
        gpus, gpu_type = int(match[2]), match[1]
    return Directives(
        job_name=values.get("job_name"),
        partition=values.get("partition"),
        nodes=_positive("--nodes", values["nodes"]) if "nodes" in values else 1,
        ntasks_per_node=_positive("--ntasks-per-node", values["ntasks_per_node"])
        if "ntasks_per_node" in values
        else 1,
        gpus_per_node=gpus,
        gpu_type=gpu_type,
        time_s=parse_slurm_time(values["time"]) if "time" in values else None,
        cpus_per_task=_positive("--cpus-per-task", values["cpus_per_task"])
        if "cpus_per_task" in values
        else None,
        memory=_memory(values["mem"]) if "mem" in values else None,
    )


def job_name(raw: str) -> str:
    """A Slurm job name as a Job name: lower case, runs of other characters as ``-``,
    at most ``MAX_NAME`` characters; ``sbatch`` when nothing is left."""
    name = _DNS.sub("-", raw.lower()).strip("-")[:MAX_NAME].strip("-")
    return name or "sbatch"


def parse_queue_map(text: str) -> dict[str, str]:
    """``gpu=training,debug=short`` → {partition: LocalQueue}; ``ValueError`` naming the
    bad item."""
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        partition, sep, queue = (s.strip() for s in item.partition("="))
        if not sep or not partition or not queue:
            raise ValueError(f"--queue-map item {item!r} is not partition=queue")
        mapping[partition] = queue
    return mapping


def job_from_script(
    script: str,
    *,
    script_name: str,
    namespace: str,
    image: str,
    queue_map: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Indexed Job that runs ``script`` as its directives ask; ``SbatchError`` when it
    cannot. ``script_name`` names the job when ``--job-name`` does not (as in Slurm)."""
    directives = parse_directives(script)
    queue = None
    if directives.partition is not None:
        queue = (queue_map or {}).get(directives.partition, directives.partition)
        if _QUEUE.fullmatch(queue) is None or len(queue) > 63:
            raise SbatchError(
                f"partition {directives.partition!r} maps to queue {queue!r}, which is no "
                "LocalQueue name; give --queue-map partition=queue"
            )
    name = job_name(directives.job_name or script_name.rsplit("/", 1)[-1].rsplit(".", 1)[0])
    return _job(directives, script, name=name, namespace=namespace, image=image, queue=queue)


def _job(
    d: Directives, script: str, *, name: str, namespace: str, image: str, queue: str | None
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if d.cpus_per_task is not None:
        requests["cpu"] = str(d.cpus_per_task * d.ntasks_per_node)
    if d.memory is not None:
        requests["memory"] = limits["memory"] = d.memory
    if d.gpus_per_node:
        requests[labels.GPU_RESOURCE] = limits[labels.GPU_RESOURCE] = str(d.gpus_per_node)
    env: list[dict[str, Any]] = [
        {"name": "SLURM_JOB_NAME", "value": name},
        {"name": "SLURM_NNODES", "value": str(d.nodes)},
        {"name": "SLURM_NTASKS_PER_NODE", "value": str(d.ntasks_per_node)},
        {
            "name": "SLURM_NODEID",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{labels.JOB_COMPLETION_INDEX}']"}
            },
        },
    ]
    if d.cpus_per_task is not None:
        env.append({"name": "SLURM_CPUS_PER_TASK", "value": str(d.cpus_per_task)})
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    job_labels: dict[str, str] = {}
    if queue is not None:
        job_labels[labels.QUEUE_NAME] = queue
    annotations: dict[str, str] = {}
    if d.gpu_type is not None:
        annotations[labels.GPU_PRODUCT] = d.gpu_type
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if job_labels:
        metadata["labels"] = job_labels
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": d.nodes,
        "parallelism": d.nodes,
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "batch",
                        "image": image,
                        "command": ["bash", "-c", script, name],
                        "env": env,
                        "resources": resources,
                    }
                ],
            }
        },
    }
    if d.time_s is not None:
        spec["activeDeadlineSeconds"] = d.time_s
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def summary(job: Mapping[str, Any]) -> Sequence[str]:
    """One line per thing a Slurm user would check: name, queue, pods, GPUs, limit."""
    meta = job["metadata"]
    spec = job["spec"]
    container = spec["template"]["spec"]["containers"][0]
    gpus = container["resources"].get("limits", {}).get(labels.GPU_RESOURCE, "0")
    queue = meta.get("labels", {}).get(labels.QUEUE_NAME, "(the namespace's default)")
    limit = spec.get("activeDeadlineSeconds")
    return (
        f"job {meta['namespace']}/{meta['name']}",
        f"queue {queue}",
        f"{spec['completions']} pods (Indexed), {gpus} GPUs each",
        f"time limit {limit}s" if limit is not None else "no time limit",
    )
