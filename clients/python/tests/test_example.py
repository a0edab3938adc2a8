"""The README's example, `examples/optuna_hyperband.py`, run as a user runs it (a separate
process, the arbiter's address and a tenant's token in AGORA_URL and AGORA_TOKEN) against a
real arbiter: the search finishes, and Postgres holds it as a finished app of the tenant whose
jobs are the study's trials."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from agora_client import Client

from conftest import ROOT, Server

# Short leases, so that the example's trials also stop at a lease's end and resume.
SERVER_SETTINGS = {"lease_seconds": 3, "round_deadline_ms": 300, "revocation_grace_seconds": 1, "tick_ms": 20}
EXAMPLE = ROOT / "examples" / "optuna_hyperband.py"
TRIALS = 8


def test_the_readme_example_runs_a_hyperband_search_through_agora(
    server: Server, tenant: Client, tenant_token: str
) -> None:
    env = {**os.environ, "AGORA_URL": server.url, "AGORA_TOKEN": tenant_token}
    try:
        finished = subprocess.run(
            [sys.executable, str(EXAMPLE), "--trials", str(TRIALS), "--pace", "0.05", "--name", "digits"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"the example did not finish in 240 s; its output:\n{expired.stdout}") from None
    assert finished.returncode == 0, finished.stdout + finished.stderr
    summary = re.search(r"app (\d+) \(digits\): (\d+) trials complete, (\d+) pruned", finished.stdout)
    assert summary, finished.stdout
    app, complete, pruned = (int(group) for group in summary.groups())
    assert complete + pruned == TRIALS and complete >= 1, finished.stdout
    assert re.search(r"best validation error 0\.\d{4}", finished.stdout), finished.stdout

    (registered,) = tenant.list_apps()
    assert (registered.id, registered.kind) == (app, "successive_halving")
    assert registered.finished_at is not None
    jobs = server.query(f"SELECT stopped, completed_iterations FROM jobs WHERE app_id = {app}")
    assert len(jobs) == TRIALS
    assert sum(job["stopped"] for job in jobs) == pruned
    assert all(job["completed_iterations"] == 27 for job in jobs if not job["stopped"])
    assert server.query(f"SELECT count(*) AS leases FROM leases WHERE app_id = {app}")[0]["leases"] >= 1
