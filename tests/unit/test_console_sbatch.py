"""``tessera sbatch``: Slurm directives become the Indexed Job a Slurm user meant, and
what cannot be honoured is refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import labels
from console.sbatch import (
    SbatchError,
    job_from_script,
    job_name,
    parse_directives,
    parse_queue_map,
    parse_slurm_time,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),
        ("90:15", 90 * 60 + 15),
        ("02:00:00", 7200),
        ("1-12", 36 * 3600),
        ("1-12:30", 36 * 3600 + 30 * 60),
        ("2-00:00:05", 48 * 3600 + 5),
        ("0", None),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_every_slurm_time_format_is_read_as_slurm_reads_it(text: str, seconds: int | None) -> None:
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "a-01", "-5", "1-", "12:xx"])
def test_a_time_slurm_would_not_take_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="Slurm time"):
        parse_slurm_time(text)


SCRIPT = """#!/bin/bash
#SBATCH --job-name=LLaMA_pretrain
#SBATCH -p gpu
#SBATCH --nodes 4 --ntasks-per-node=8
#SBATCH --gres=gpu:h100:8
#SBATCH -t 1-00:00
#SBATCH -c 12
#SBATCH --mem=500G

srun python train.py
#SBATCH --exclusive
"""


def job(script: str = SCRIPT, **kwargs: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "script_name": "train.sbatch",
        "namespace": "team-nlp",
        "image": "registry.example/train:1",
        "queue_map": {"gpu": "training"},
    }
    options.update(kwargs)
    return job_from_script(script, **options)


def test_a_multi_node_gpu_script_becomes_an_indexed_job_in_the_mapped_queue() -> None:
    built = job()
    spec = built["spec"]
    container = spec["template"]["spec"]["containers"][0]
    assert built["metadata"]["name"] == "llama-pretrain"
    assert built["metadata"]["labels"] == {labels.QUEUE_NAME: "training"}
    assert built["metadata"]["annotations"] == {labels.GPU_PRODUCT: "h100"}
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    assert spec["activeDeadlineSeconds"] == 86400
    assert container["resources"]["limits"] == {labels.GPU_RESOURCE: "8", "memory": "500Gi"}
    assert container["resources"]["requests"]["cpu"] == "96"  # 12 per task x 8 tasks
    assert container["command"][:3] == ["bash", "-c", SCRIPT]
    env = {e["name"]: e for e in container["env"]}
    assert env["SLURM_NNODES"]["value"] == "4"
    assert labels.JOB_COMPLETION_INDEX in env["SLURM_NODEID"]["valueFrom"]["fieldRef"]["fieldPath"]


@pytest.mark.parametrize(
    ("lines", "field", "value"),
    [
        ("#SBATCH -N2", "nodes", 2),
        ("#SBATCH -N 3", "nodes", 3),
        ("#SBATCH --nodes=5", "nodes", 5),
        ("#SBATCH -J name", "job_name", "name"),
        ("#SBATCH -pdebug", "partition", "debug"),
        ("#SBATCH --partition debug", "partition", "debug"),
        ("#SBATCH --gres=gpu:2", "gpus_per_node", 2),
        ("#SBATCH --gres gpu:a100:4", "gpu_type", "a100"),
        ("#SBATCH -t 10", "time_s", 600),
        ("#SBATCH --time=10:00", "time_s", 600),
        ("#SBATCH --cpus-per-task 4", "cpus_per_task", 4),
        ("#SBATCH --mem=4000", "memory", "4000Mi"),
        ("#SBATCH --mem=64G", "memory", "64Gi"),
        ("#SBATCH --mem 512M", "memory", "512Mi"),
        ("#SBATCH --ntasks-per-node 2", "ntasks_per_node", 2),
    ],
)
def test_long_short_and_spaced_forms_read_the_same(lines: str, field: str, value: object) -> None:
    assert getattr(parse_directives(f"#!/bin/bash\n{lines}\necho hi\n"), field) == value


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        ("#SBATCH --exclusive", "--exclusive"),
        ("#SBATCH --dependency=afterok:12", "--dependency"),
        ("#SBATCH -n 16", "-n"),
        ("#SBATCH --array=0-9", "--array"),
        ("#SBATCH --nodes=2 --constraint=ib", "--constraint"),
    ],
)
def test_an_unsupported_directive_is_refused_by_name(lines: str, named: str) -> None:
    with pytest.raises(SbatchError, match=f"#SBATCH {named} is not supported"):
        job(f"#!/bin/bash\n{lines}\n")


@pytest.mark.parametrize(
    ("lines", "complaint"),
    [
        ("#SBATCH --gres=gpu:x", "only GPUs"),
        ("#SBATCH --gres=nic:1", "only GPUs"),
        ("#SBATCH --nodes=0", "positive whole number"),
        ("#SBATCH -t 1h", "Slurm time"),
        ("#SBATCH --mem=lots", "size"),
        ("#SBATCH --job-name", "needs a value"),
    ],
)
def test_a_malformed_directive_is_refused_with_what_would_do(lines: str, complaint: str) -> None:
    with pytest.raises(SbatchError, match=complaint):
        job(f"#!/bin/bash\n{lines}\n")


def test_directives_after_the_first_command_are_ignored_as_sbatch_ignores_them() -> None:
    # SCRIPT's --exclusive follows `srun`: sbatch never reads it, nor do we
    assert job()["spec"]["completions"] == 4


def test_without_name_or_partition_the_file_names_the_job_and_the_namespace_default_queues_it() -> (
    None
):
    built = job("#!/bin/bash\n#SBATCH --gres=gpu:1\nnvidia-smi\n", script_name="My Run.sh")
    assert built["metadata"]["name"] == "my-run"
    assert "labels" not in built["metadata"]
    assert "activeDeadlineSeconds" not in built["spec"]


def test_an_unmapped_partition_is_a_queue_of_its_own_name_and_a_bad_one_is_refused() -> None:
    assert job(queue_map={})["metadata"]["labels"][labels.QUEUE_NAME] == "gpu"
    with pytest.raises(SbatchError, match="--queue-map"):
        job("#SBATCH -p GPU_Big\n", queue_map={})


@pytest.mark.parametrize(
    ("raw", "name"),
    [("train", "train"), ("LLaMA_7B run", "llama-7b-run"), ("___", "sbatch"), ("a" * 80, "a" * 52)],
)
def test_job_names_become_dns_labels(raw: str, name: str) -> None:
    assert job_name(raw) == name


def test_the_queue_map_reads_pairs_and_names_a_bad_item() -> None:
    assert parse_queue_map("gpu=training, debug=short,") == {"gpu": "training", "debug": "short"}
    with pytest.raises(ValueError, match="'gpu' is not partition=queue"):
        parse_queue_map("gpu")
