"""`python -m certs` as an admin runs it: a real process writing a real folder."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

REPO = Path(__file__).resolve().parents[2]
FILES = {
    "ca.crt": 0o644,
    "ca.key": 0o600,
    "ca-bundle.crt": 0o644,
    "webhook.crt": 0o644,
    "webhook.key": 0o600,
    "extender.crt": 0o644,
    "extender.key": 0o600,
    "kube-scheduler.crt": 0o644,
    "kube-scheduler.key": 0o600,
}
LONG_AGO = 1_000_000_000  # 2001: an mtime no run could have written


def certs(*args: str | Path, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "certs", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def backdate(folder: Path) -> None:
    for path in folder.iterdir():
        os.utime(path, (LONG_AGO, LONG_AGO))


def cert(folder: Path, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate((folder / name).read_bytes())


def test_first_run_writes_every_file_with_private_keys_0600(tmp_path: Path) -> None:
    out = tmp_path / "certs-out"
    done = certs("--out", out, "--dns", "localhost", "--ip", "127.0.0.1", cwd=tmp_path)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == FILES
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    # stdout is the caBundle alone, so that CA_BUNDLE=$(python -m certs ...) works.
    assert done.stdout == base64.b64encode((out / "ca-bundle.crt").read_bytes()).decode() + "\n"
    assert "webhook         created" in done.stderr


def test_second_run_touches_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = certs("--out", out, "--dns", "localhost", cwd=tmp_path)
    backdate(out)
    before = snapshot(out)
    second = certs("--out", out, "--dns", "localhost", cwd=tmp_path)
    assert snapshot(out) == before
    assert second.stdout == first.stdout
    assert "0 file(s) written" in second.stderr


def test_near_expiry_certificates_are_reissued_from_the_same_ca(tmp_path: Path) -> None:
    out = tmp_path / "out"
    certs("--out", out, "--days", "10", "--renew-before", "2", cwd=tmp_path)
    backdate(out)
    before = snapshot(out)
    ca = cert(out, "ca.crt")

    # The defaults renew whatever expires within 30 days: the 10-day certificates.
    done = certs("--out", out, cwd=tmp_path)
    after = snapshot(out)
    unchanged = {name for name in before if after[name] == before[name]}
    assert unchanged == {"ca.crt", "ca.key", "ca-bundle.crt"}
    for name in ("webhook.crt", "extender.crt", "kube-scheduler.crt"):
        renewed = cert(out, name)
        renewed.verify_directly_issued_by(ca)
        left = renewed.not_valid_after_utc - datetime.now(UTC)
        assert timedelta(days=364) < left <= timedelta(days=365)
    assert done.stderr.count("renewed") == 3

    backdate(out)
    settled = snapshot(out)
    certs("--out", out, cwd=tmp_path)
    assert snapshot(out) == settled


def test_a_new_key_type_reissues_the_leaves_and_keeps_the_ca(tmp_path: Path) -> None:
    out = tmp_path / "out"
    certs("--out", out, cwd=tmp_path)
    ca_before = (out / "ca.crt").read_bytes()
    certs("--out", out, "--key-type", "rsa-2048", cwd=tmp_path)
    assert (out / "ca.crt").read_bytes() == ca_before
    assert isinstance(cert(out, "webhook.crt").public_key(), rsa.RSAPublicKey)


def test_a_key_readable_by_others_is_tightened(tmp_path: Path) -> None:
    out = tmp_path / "out"
    certs("--out", out, cwd=tmp_path)
    (out / "webhook.key").chmod(0o644)
    done = certs("--out", out, cwd=tmp_path)
    assert stat.S_IMODE((out / "webhook.key").stat().st_mode) == 0o600
    assert "webhook.key: was readable by others, now 0600" in done.stderr


MANIFEST = """\
# Tessera's admission webhook. `make certs` fills in caBundle.
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: tessera-webhook
webhooks:
  - name: jobs.tessera.dev
    admissionReviewVersions: [v1]
    clientConfig:
      service:
        name: tessera-webhook   # the Service in front of the Deployment
        namespace: tessera-system
        path: /mutate
      caBundle: ""  # replaced by make certs
    sideEffects: None
  - name: pods.tessera.dev
    clientConfig:
      caBundle: Cg==
      service: {name: tessera-webhook, namespace: tessera-system, path: /mutate}
    sideEffects: None
---
# Not ours: left exactly as it is.
apiVersion: v1
kind: Service
metadata:
  name: tessera-webhook
"""


def test_patch_manifests_rewrites_only_the_ca_bundles(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    (manifests / "webhook").mkdir(parents=True)
    (manifests / "webhook" / "configuration.yaml").write_text(MANIFEST)
    (manifests / "kustomization.yaml").write_text("resources: [webhook/configuration.yaml]\n")
    (manifests / "README.md").write_text("caBundle: not yaml, not touched\n")

    # Without DIR, --patch-manifests means manifests/ in the current folder.
    done = certs("--out", tmp_path / "out", "--patch-manifests", cwd=tmp_path)
    bundle = done.stdout.strip()
    expected = MANIFEST.replace('caBundle: ""', f'caBundle: "{bundle}"').replace(
        "caBundle: Cg==", f"caBundle: {bundle}"
    )
    assert (manifests / "webhook" / "configuration.yaml").read_text() == expected
    assert (manifests / "README.md").read_text() == "caBundle: not yaml, not touched\n"
    assert "caBundle set in 2 webhook(s)" in done.stderr

    backdate(manifests / "webhook")
    before = snapshot(manifests / "webhook")
    certs("--out", tmp_path / "out", "--patch-manifests", manifests, cwd=REPO)
    assert snapshot(manifests / "webhook") == before


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--ip", "300.1.1.1"], 2, "error: --ip '300.1.1.1' is not an IPv4 or IPv6 address"),
        (["--dns", "under_score"], 2, "error: --dns 'under_score' is not a valid DNS name"),
        (["--key-type", "dsa"], 2, "argument --key-type: invalid choice: 'dsa'"),
        (["--days", "ten"], 2, "argument --days: invalid int value: 'ten'"),
        (["--days", "10", "--renew-before", "20"], 2, "--renew-before (20) must be shorter"),
        (["--patch-manifests", "no-such-folder"], 1, "error: no-such-folder is not a folder"),
    ],
)
def test_bad_flags_are_one_line_errors(
    tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    done = certs("--out", tmp_path / "out", *args, cwd=tmp_path, ok=False)
    assert done.returncode == status
    assert message in done.stderr
    assert done.stdout == ""


def test_a_broken_ca_stops_the_run_and_says_how_to_recover(tmp_path: Path) -> None:
    out = tmp_path / "out"
    certs("--out", out, cwd=tmp_path)
    (out / "ca.key").unlink()
    done = certs("--out", out, cwd=tmp_path, ok=False)
    assert done.returncode == 1
    assert "ca.key is missing" in done.stderr
    assert "delete ca.crt and ca.key to create a new CA" in done.stderr


def test_help_shows_examples(tmp_path: Path) -> None:
    done = certs("--help", cwd=tmp_path)
    assert "examples:" in done.stdout
    assert "--out certs-out --dns localhost --ip 127.0.0.1" in done.stdout
