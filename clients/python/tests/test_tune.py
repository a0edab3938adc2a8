"""Ray Tune through a real arbiter (`scripts/test-python --tune`; CI leaves Ray out): ASHA
trials run on leased GPUs, stop before their leases end and resume from their checkpoints,
and the jobs' stored progress is the search's outcome."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from agora_client import Client, Conflict, models  # noqa: E402
from agora_client.trials import search_spec  # noqa: E402
from agora_client.tune import AgoraBroker, AgoraTuneTrial, run_tune  # noqa: E402

from conftest import Server, within_lease  # noqa: E402

SERVER_SETTINGS = {"lease_seconds": 3, "round_deadline_ms": 300, "revocation_grace_seconds": 1, "tick_ms": 20}
# A trial's steps take longer than a lease (3 s), so a trial that runs them all outlives one;
# ASHA lets the first trial at each rung go on, so one always does.
MAX_ITERATIONS = 8
STEP_SECONDS = 0.5


def train(config: dict, run: AgoraTuneTrial) -> None:
    """A search where later is worse: the loss is the time the step ended, so the second trial
    to reach a rung is worse than the first there, and ASHA stops it (`config` is Tune's
    sample, unused). The state records each run's lease and times."""
    state = run.restore()
    resumed = state is not None
    state = state or {"step": 0, "runs": []}
    state["runs"].append([run.lease, time.time(), time.time()])
    while state["step"] < MAX_ITERATIONS:
        time.sleep(STEP_SECONDS)  # one step of training
        state["step"] += 1
        state["runs"][-1][2] = loss = time.time()
        run.report({"loss": loss, "resumed": resumed, "runs": state["runs"]}, state["step"], checkpoint=state)


@pytest.fixture(scope="module")
def ray_cluster():
    # Ray's workers import this module (the trainable) from the tests' folder.
    tests = str(Path(__file__).resolve().parent)
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": tests}})
    yield
    ray.shutdown()


def test_an_asha_search_runs_on_leases_and_its_progress_is_stored(
    server: Server, tenant_token: str, ray_cluster: None, tmp_path: Path
) -> None:
    app, results = run_tune(
        train,
        base_url=server.url,
        token=tenant_token,
        app_name="bowl-asha",
        param_space={"x": tune.uniform(-3.0, 3.0)},
        num_samples=6,
        metric="loss",
        mode="min",
        max_iterations=MAX_ITERATIONS,
        seconds_per_iteration=STEP_SECONDS,
        grace_period=2,
        reduction_factor=2,
        # A trial's first step after it gets a GPU is checked by nothing else: Ray's workers on a
        # loaded machine start slowly, so ask for half the lease.
        min_time_left=1.5,
        storage_path=str(tmp_path),
    )
    assert not results.errors
    finals = [result.metrics for result in results]
    assert len(finals) == 6
    leases = {
        row["id"]: row
        for row in server.query(
            "SELECT id, extract(epoch from start_at) AS start, "
            "extract(epoch from coalesce(ended_at, end_at)) AS stop "
            f"FROM leases WHERE app_id = {app.id}"
        )
    }
    for final in finals:
        for lease, started, stopped in final["runs"]:
            assert within_lease(leases[lease]["start"], leases[lease]["stop"], started, stopped), (
                started,
                stopped,
                leases[lease],
            )
    jobs = server.query(f"SELECT completed_iterations, stopped FROM jobs WHERE app_id = {app.id}")
    outcomes = sorted((job["stopped"], job["completed_iterations"]) for job in jobs)
    assert outcomes == sorted(
        (final["agora_iterations"] < MAX_ITERATIONS, final["agora_iterations"]) for final in finals
    )
    assert any(stopped for stopped, _ in outcomes), "ASHA stopped no trial early"
    assert any(len(final["runs"]) > 1 for final in finals), "no trial outlived a lease"
    with Client(server.url, tenant_token) as client:
        assert client.get_app(app.id).finished_at is not None


def test_tune_ending_a_trial_whose_last_step_finished_the_app_repeats_that_report(
    server: Server, tenant_token: str
) -> None:
    # The trainable's last step reported the app's only job done, and the arbiter finished the
    # app; Tune stopped the trial before the trainable returned, so the broker hears of its end
    # and reports it again, which the arbiter answers as it answered the step.
    spec = search_spec(n_trials=1, max_iterations=2, seconds_per_iteration=0.1, halving=None)
    with Client(server.url, tenant_token) as client:
        app = client.register_app(models.RegisterApp(name="last-step", app=spec))
        broker = AgoraBroker(server.url, tenant_token, app.id, max_iterations=2, min_time_left=1.0)
        try:
            assert broker.job_of("tune-trial") == "trial-0"
            assert client.report_progress(app.id, [models.JobProgress("trial-0", 2)]).finished
            broker.trial_ended("tune-trial", 2)
            # A stop short of the end is not what the app took: the finished app refuses it.
            with pytest.raises(Conflict, match="not active"):
                broker.trial_ended("tune-trial", 1)
        finally:
            broker.stop()
