"""Optuna studies through a real arbiter: trials run only on leased GPUs, stop before their
lease ends or is revoked, resume from their checkpoints, and what Postgres holds of bids and
leases matches the study."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import optuna
import pytest

from agora_client import Client, Unauthorized, Unprocessable, models
from agora_client.optuna import RUNS_ATTR, AgoraTrial, StudyResult, app_spec, run_study
from agora_client.trials import Checkpoints, GpuSlot, TrialRun, search_spec

from conftest import Server, within_lease

# Short leases, so that trials outlive several of them and must stop and resume.
SERVER_SETTINGS = {"lease_seconds": 3, "round_deadline_ms": 300, "revocation_grace_seconds": 1, "tick_ms": 20}
STEP_SECONDS = 0.1

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Objective:
    """A quadratic bowl learnt step by step: each step takes `STEP_SECONDS` of 'training' and
    brings the loss closer to (x - 1)^2. Records every attempt: where it ran and what it
    resumed from."""

    def __init__(self, max_iterations: int, on_step: Any = None) -> None:
        self.max_iterations = max_iterations
        self.attempts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.on_step = on_step

    def __call__(self, trial: optuna.Trial, run: AgoraTrial) -> float:
        x = trial.suggest_float("x", -3.0, 3.0)
        state = run.restore()
        with self.lock:
            self.attempts.append(
                {
                    "trial": trial.number,
                    "lease": run.lease,
                    "resumed_at": state and state["step"],
                    "device": run.cuda_visible_devices,
                }
            )
        state = state or {"step": 0, "loss": 10.0}
        while state["step"] < self.max_iterations:
            threading.Event().wait(STEP_SECONDS)  # one step of training
            state = {"step": state["step"] + 1, "loss": (x - 1.0) ** 2 + 1.0 / (state["step"] + 1)}
            if self.on_step:
                self.on_step(trial, run, state)
            run.report(state["loss"], state["step"], checkpoint=state)
        return state["loss"]


def epoch(moment: str) -> str:
    return f"extract(epoch from {moment})"


def check_history(server: Server, study: optuna.Study, result: StudyResult, max_iterations: int) -> None:
    """Every run of every trial lies within a lease of the app on one of its GPUs; the jobs'
    stored progress is the trials' outcome; every lease was won in a round the app stood in."""
    leases = {
        row["id"]: row
        for row in server.query(
            f"SELECT id, round_id, gpus, state, {epoch('start_at')} AS start, "
            f"{epoch('coalesce(ended_at, end_at)')} AS stop FROM leases WHERE app_id = {result.app.id}"
        )
    }
    for trial in study.trials:
        for lease_id, gpu, started, stopped in trial.user_attrs[RUNS_ATTR]:
            lease = leases[lease_id]
            assert gpu in lease["gpus"]
            assert within_lease(lease["start"], lease["stop"], started, stopped), (
                trial.number,
                started,
                stopped,
                lease,
            )
    jobs = {
        row["name"]: row
        for row in server.query(
            f"SELECT name, completed_iterations, stopped FROM jobs WHERE app_id = {result.app.id}"
        )
    }
    assert len(jobs) == len(study.trials)
    for trial in study.trials:
        job = jobs[result.jobs[trial.number]]
        if trial.state == optuna.trial.TrialState.PRUNED:
            assert job["stopped"] and job["completed_iterations"] == trial.last_step
        else:
            assert trial.state == optuna.trial.TrialState.COMPLETE
            assert (job["stopped"], job["completed_iterations"]) == (False, max_iterations)
    grants = server.query(
        f"SELECT l.id, a.kept_gpus, a.leftover_gpus, b.id AS bid FROM leases l "
        f"JOIN round_allocations a ON a.round_id = l.round_id AND a.app_id = l.app_id "
        f"LEFT JOIN bids b ON b.round_id = l.round_id AND b.app_id = l.app_id "
        f"WHERE l.app_id = {result.app.id}"
    )
    assert {row["id"] for row in grants} == set(leases)
    for row in grants:
        assert set(leases[row["id"]]["gpus"]) <= set(row["kept_gpus"]) | set(row["leftover_gpus"])
        if row["kept_gpus"]:
            assert row["bid"] is not None, f"lease {row['id']} won in an auction the app did not bid in"
    assert server.query(
        f"SELECT finished_at IS NOT NULL AS finished FROM apps WHERE id = {result.app.id}"
    ) == [{"finished": True}]


def test_a_pruned_study_runs_to_completion_on_leases_and_resumes_a_revoked_trial(
    server: Server, tenant: Client, admin: Client
) -> None:
    # Rungs at 1, 3 and 9 of 24 iterations. The first trial past the last rung loses its GPU
    # at iteration 10: the admin drains it. The grace period (1 s, 10 steps) ends before the
    # trial could, and no rung lies between, so it must checkpoint, stop and resume elsewhere.
    max_iterations, drain_at = 24, 10
    drained: dict[str, Any] = {}
    lock = threading.Lock()

    def drain_once(trial: optuna.Trial, run: AgoraTrial, state: dict[str, Any]) -> None:
        with lock:
            if drained or state["step"] != drain_at:
                return
            drained.update(trial=trial.number, lease=run.lease, gpu=run.gpus[0].id)
        drained["ack"] = admin.drain_gpu(drained["gpu"])

    objective = Objective(max_iterations, on_step=drain_once)
    study = optuna.create_study(
        sampler=optuna.samplers.RandomSampler(seed=7),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3),
    )
    result = run_study(
        study,
        objective,
        client=tenant,
        app_name="bowl-halving",
        n_trials=8,
        max_iterations=max_iterations,
        seconds_per_iteration=STEP_SECONDS,
        max_parallel=4,
        min_time_left=0.5,
        acquire_timeout=60,
    )
    admin.restore_gpu(drained["gpu"])

    states = [trial.state for trial in study.trials]
    assert len(states) == 8 and optuna.trial.TrialState.PRUNED in states
    assert set(states) <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    check_history(server, study, result, max_iterations)

    # The drained trial's lease was revoked; the trial stopped on it after its checkpoint at
    # `drain_at` or later, and its next attempt resumed from that checkpoint.
    assert drained["ack"].lease == drained["lease"]
    assert server.query(f"SELECT state FROM leases WHERE id = {drained['lease']}") == [{"state": "revoked"}]
    attempts = [attempt for attempt in objective.attempts if attempt["trial"] == drained["trial"]]
    revoked = max(index for index, attempt in enumerate(attempts) if attempt["lease"] == drained["lease"])
    resumed = attempts[revoked + 1]
    assert resumed["lease"] != drained["lease"] and drain_at <= resumed["resumed_at"] < max_iterations
    assert study.trials[drained["trial"]].state == optuna.trial.TrialState.COMPLETE
    # Every stop at a lease's end resumed later from the trial's checkpoint.
    assert sum(attempt["resumed_at"] is not None for attempt in objective.attempts) == result.preemptions >= 1
    assert all(attempt["device"].startswith("GPU-") for attempt in objective.attempts)


def test_two_tenants_studies_share_the_cluster_and_both_finish(server: Server, admin: Client) -> None:
    # The vision team's study starts alone and takes the whole cluster (6 trials, 4 GPUs); the
    # speech team's registers while vision's trials run on every GPU, and must still hold GPUs
    # within a few rounds.
    outcomes: dict[str, tuple[optuna.Study, StudyResult]] = {}
    failures: dict[str, BaseException] = {}
    vision_holds_the_cluster = threading.Event()

    def note_running(trial: optuna.Trial, run: AgoraTrial, state: dict[str, Any]) -> None:
        if vision_holds_the_cluster.is_set():
            return
        held = server.query(
            f"SELECT sum(cardinality(gpus)) AS gpus FROM leases WHERE state = 'active' "
            f"AND app_id = (SELECT app_id FROM leases WHERE id = {run.lease})"
        )
        if held == [{"gpus": 4}]:
            vision_holds_the_cluster.set()

    def search(name: str, on_step: Any = None) -> None:
        try:
            if name == "speech" and not vision_holds_the_cluster.wait(60):
                raise AssertionError("the vision study never held all 4 GPUs at once")
            with server.client(admin.create_tenant(f"team-{name}").token) as client:
                study = optuna.create_study(
                    sampler=optuna.samplers.RandomSampler(seed=len(name)),
                    pruner=optuna.pruners.HyperbandPruner(min_resource=2, max_resource=8, reduction_factor=2),
                )
                result = run_study(
                    study,
                    Objective(8, on_step=on_step),
                    client=client,
                    app_name=name,
                    n_trials=6,
                    max_iterations=8,
                    seconds_per_iteration=STEP_SECONDS,
                    min_time_left=0.5,
                    acquire_timeout=60,
                )
                outcomes[name] = (study, result)
        except BaseException as error:
            failures[name] = error

    threads = [
        threading.Thread(target=search, args=("vision", note_running)),
        threading.Thread(target=search, args=("speech",)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
        assert not thread.is_alive(), "a study did not finish in 300 s"
    assert not failures, failures
    assert set(outcomes) == {"vision", "speech"}
    for study, result in outcomes.values():
        assert all(trial.state.is_finished() for trial in study.trials) and len(study.trials) == 6
        check_history(server, study, result, 8)
        # Each held GPUs within a few rounds of registering, whatever the other did.
        waited = server.query(
            f"SELECT count(*) AS rounds FROM rounds r, apps a "
            f"WHERE a.id = {result.app.id} AND r.opened_at >= a.arrived_at "
            f"AND r.id <= (SELECT min(round_id) FROM leases WHERE app_id = a.id)"
        )
        assert 1 <= waited[0]["rounds"] <= 3, (result.app.name, waited)
    # The speech study registered while the vision study held every GPU.
    vision, speech = outcomes["vision"][1].app, outcomes["speech"][1].app
    assert server.query(
        f"SELECT count(*) AS held FROM leases l, apps a WHERE a.id = {speech.id} AND l.app_id = {vision.id} "
        f"AND l.start_at <= a.arrived_at AND coalesce(l.ended_at, l.end_at) > a.arrived_at"
    ) != [{"held": 0}]


def test_a_trial_whose_last_step_finished_the_app_completes_without_another_report(
    server: Server, tenant: Client, tmp_path: Path
) -> None:
    # The app's only job reaches its last iteration as its lease runs out: the step's report
    # ends the job, so the arbiter finishes the app; the trial neither stops for the lease
    # (there is no next step) nor reports its completion again (the app refuses progress now).
    spec = search_spec(n_trials=1, max_iterations=2, seconds_per_iteration=0.1, halving=None)
    app = tenant.register_app(models.RegisterApp(name="last-step", app=spec))
    gpu = models.LeasedGpu(id="gpu-0", host="host-0", cuda_uuid="GPU-0", gpu_type="h100")
    now = [0.0]
    slot = GpuSlot(1, gpu, deadline=10.0)
    run = TrialRun(tenant, app.id, "trial-0", 2, slot, Checkpoints(tmp_path), clock=lambda: now[0])
    now[0] = 1.0
    run.step(1, checkpoint="epoch 1")
    now[0] = 9.5  # Another step of 8.5 s would outlast the lease.
    run.step(2, checkpoint="epoch 2")
    assert tenant.get_app(app.id).finished_at is not None
    run.complete()
    assert server.query(f"SELECT stopped, completed_iterations FROM jobs WHERE app_id = {app.id}") == [
        {"stopped": False, "completed_iterations": 2}
    ]


def test_the_pruner_decides_the_apps_shape() -> None:
    halving = app_spec(
        optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3),
        n_trials=9,
        max_iterations=27,
        seconds_per_iteration=2.0,
    )
    assert isinstance(halving, models.SuccessiveHalving)
    assert halving.phase_iterations == [1, 2, 6, 18] and halving.jobs_per_phase == [9, 3, 1, 1]
    assert halving.budget_gpu_seconds == (9 * 1 + 3 * 2 + 1 * 6 + 1 * 18) * 2.0
    hyperband = app_spec(
        optuna.pruners.HyperbandPruner(min_resource=3, max_resource=27, reduction_factor=3),
        n_trials=4,
        max_iterations=27,
        seconds_per_iteration=1.0,
    )
    assert isinstance(hyperband, models.SuccessiveHalving) and hyperband.phase_iterations == [3, 6, 18]
    curve = app_spec(optuna.pruners.MedianPruner(), n_trials=2, max_iterations=10, seconds_per_iteration=1.0)
    assert isinstance(curve, models.PerformanceCurve) and [
        job.predicted_final_iteration for job in curve.jobs
    ] == [10, 10]
    with pytest.raises(ValueError, match="seconds_per_iteration"):
        app_spec(
            optuna.pruners.NopPruner(), n_trials=2, max_iterations=10, seconds_per_iteration=float("nan")
        )


def test_a_study_with_a_wrong_token_or_a_bad_shape_registers_nothing(server: Server, tenant: Client) -> None:
    study = optuna.create_study()
    with server.client("wrong-token") as stranger, pytest.raises(Unauthorized, match="Bearer"):
        run_study(
            study,
            Objective(4),
            client=stranger,
            app_name="x",
            n_trials=2,
            max_iterations=4,
            seconds_per_iteration=0.1,
        )
    with pytest.raises(ValueError, match="n_trials"):
        run_study(
            study,
            Objective(4),
            client=tenant,
            app_name="x",
            n_trials=0,
            max_iterations=4,
            seconds_per_iteration=0.1,
        )
    with pytest.raises(Unprocessable, match="serial_iteration_time"):
        run_study(
            study,
            Objective(4),
            client=tenant,
            app_name="x",
            n_trials=2,
            max_iterations=4,
            seconds_per_iteration=1e-9,
        )
    assert tenant.list_apps() == [] and study.trials == []
