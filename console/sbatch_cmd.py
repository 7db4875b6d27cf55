"""``tessera sbatch``: a Slurm batch script as a Kubernetes Job, created or shown.

Layer: I/O (it awaits the ``Source``). Lets the PURE ``console.sbatch`` translate the
script, creates the Job unless a dry run, and renders it. Must not translate anything
itself, nor read the script file or the environment (``__main__`` reads both).
"""

from __future__ import annotations

from cluster.kube import KubeError
from console.output import ConsoleError, Output, json_text, yaml_text
from console.sbatch import SbatchError, job_from_script, parse_queue_map, summary
from console.source import Source


async def sbatch(
    source: Source | None,
    script: str,
    script_name: str,
    *,
    namespace: str,
    image: str | None,
    queue_map: str = "",
    output: str = "table",
    dry_run: bool = False,
) -> Output:
    """Translate the script; create the Job unless ``dry_run`` (``source`` None: only a
    dry run is possible)."""
    if not image:
        raise ConsoleError("--image is needed: a Slurm script names no container image")
    try:
        job = job_from_script(
            script,
            script_name=script_name,
            namespace=namespace,
            image=image,
            queue_map=parse_queue_map(queue_map),
        )
    except (SbatchError, ValueError) as exc:
        raise ConsoleError(f"{script_name}: {exc}") from None
    notes: list[str] = []
    if source is not None and not source.writable and not dry_run:
        notes.append("note: a cluster file is read-only: the Job was not created (as --dry-run)")
        dry_run = True
    if not dry_run:
        assert source is not None
        try:
            job = await source.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
        except KubeError as exc:
            raise ConsoleError(
                f"job {namespace}/{job['metadata']['name']} not created: {exc}"
            ) from None
    if output == "json":
        return Output(json_text(job), tuple(notes))
    if output == "yaml":
        return Output(yaml_text(job), tuple(notes))
    verb = "would be created (dry run)" if dry_run else "created"
    lines = [f"job.batch/{job['metadata']['name']} {verb}", *(f"  {s}" for s in summary(job))]
    return Output("\n".join(lines) + "\n", tuple(notes))
