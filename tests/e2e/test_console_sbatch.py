"""``tessera sbatch`` against the real stack: a Slurm batch script becomes an Indexed Job
that kube-apiserver stores through Tessera's webhook (suspended, gang keys written) and
that Kueue admits to the queue the partition maps to.

Runs the console as a Slurm user does, ``python -m console sbatch`` with a kubeconfig.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.jobs import IMAGE, NAMESPACE, QUEUE
from tests.e2e.test_console import tessera

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SCRIPT = """#!/bin/bash
#SBATCH --job-name=sbatch-e2e
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --time=30:00
srun python train.py
"""


def test_a_batch_script_is_created_suspended_by_the_webhook_and_admitted_by_kueue(
    e2e: E2ECluster, tmp_path: Path
) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text(SCRIPT)
    args = ("sbatch", str(script), "--queue-map", f"gpu={QUEUE}", "-n", NAMESPACE)
    done = tessera(e2e, *args, "--image", IMAGE, "-o", "json")
    # what kube-apiserver stored, as the webhook left it
    stored: dict[str, Any] = jsonio.loads(done.stdout)
    assert stored["metadata"]["name"] == "sbatch-e2e"
    assert stored["metadata"]["labels"][labels.QUEUE_NAME] == QUEUE
    spec = stored["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"]) == ("Indexed", 2, 2)
    assert spec["activeDeadlineSeconds"] == 1800
    assert spec["suspend"] is True
    template = spec["template"]
    assert template["metadata"]["labels"][labels.GANG] == f"{NAMESPACE}.sbatch-e2e"
    (container,) = template["spec"]["containers"]
    assert container["resources"]["limits"][labels.GPU_RESOURCE] in (1, "1")
    assert container["command"][2] == SCRIPT  # bash -c SCRIPT NAME

    workload = e2e.wait_admitted("sbatch-e2e")
    assert workload["spec"]["queueName"] == QUEUE
    assert workload["status"]["admission"]["clusterQueue"] == "e2e-training"
    job = e2e.get_json("job", "sbatch-e2e", "-n", NAMESPACE)
    assert job["spec"]["suspend"] is False

    # the same name again is refused by kube-apiserver, in one line
    again = tessera(e2e, *args, "--image", IMAGE, code=1)
    assert again.stderr.startswith(f"tessera: job {NAMESPACE}/sbatch-e2e not created:")
    e2e.delete_jobs()
