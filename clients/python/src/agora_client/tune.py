"""Ray Tune searches whose trials run on GPUs leased from Agora.

The search is an Agora app and each Tune trial one of its jobs. `run_tune` registers it, runs
Tune with its asynchronous successive halving (`ASHAScheduler`, Themis's successive-halving
app: the same rungs are declared to the arbiter) or without early stopping (a
performance-curve app), and finishes the app at the end.

```python
def train(config: dict, run: AgoraTuneTrial) -> None:
    state = run.restore() or {"epoch": 0, "model": new_model(config["lr"])}
    while state["epoch"] < 27:
        loss = train_one_epoch(state["model"], device=run.cuda_visible_devices)
        state["epoch"] += 1
        run.report({"loss": loss}, state["epoch"], checkpoint=state)

results = run_tune(train, base_url=URL, token=TOKEN, app_name="mlp-asha",
                   param_space={"lr": tune.loguniform(1e-4, 1e-1)}, num_samples=16,
                   metric="loss", mode="min", max_iterations=27, seconds_per_iteration=0.5,
                   grace_period=1, reduction_factor=3)
```

Trials in Ray's worker processes take their GPUs from one broker (a Ray actor following the
app's events, `trials.LeasedGpus`). A trial starts only on a GPU of an active lease; before its
lease ends or is revoked it checkpoints and stops (`LeaseEnding`), gives the GPU back, and waits
in its worker for the next GPU, where it resumes from the checkpoint. Trials the scheduler stops
are reported to the arbiter as stopped early.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from . import models
from .client import Client
from .trials import Checkpoints, GpuSlot, LeasedGpus, LeaseEnding, TrialRun, search_spec

ITERATIONS_METRIC = "agora_iterations"
"""The metric every report carries: the trial's iterations done (the scheduler's time)."""


class AgoraTuneTrial:
    """What a trainable sees of its place on the cluster (see the module's example)."""

    def __init__(self, run: TrialRun) -> None:
        self._run = run

    @property
    def cuda_visible_devices(self) -> str:
        """The leased GPU, as `CUDA_VISIBLE_DEVICES` expects (its CUDA UUID)."""
        return self._run.cuda_visible_devices

    @property
    def lease(self) -> int:
        return self._run.lease

    def restore(self) -> Any | None:
        """The last checkpoint this trial reported, or `None` on its first run."""
        return self._run.restore()

    def report(self, metrics: dict[str, Any], iterations: int, *, checkpoint: Any) -> None:
        """After `iterations` in all: reports `metrics` to Tune (whose scheduler may stop the
        trial here), then saves `checkpoint` and reports progress to Agora; raises `LeaseEnding`
        when the lease leaves no time for another step. The lease is checked last, as the next
        step would start, since Tune's report may wait for the driver."""
        tune.report({**metrics, ITERATIONS_METRIC: iterations})
        self._run.step(iterations, checkpoint)


class AgoraBroker:
    """The app's leased GPUs for every trial of the search (a threaded Ray actor)."""

    def __init__(
        self, base_url: str, token: str, app: int, max_iterations: int, min_time_left: float
    ) -> None:
        self._client = Client(base_url, token)
        self._app = app
        self._max_iterations = max_iterations
        self._gpus = LeasedGpus(self._client, app, min_time_left=min_time_left)
        self._gpus.start()
        self._jobs: dict[str, str] = {}
        self._held: dict[str, GpuSlot] = {}
        self._completed: set[str] = set()

    def job_of(self, trial_id: str) -> str:
        """The Agora job of a Tune trial, given out in order of first asking."""
        return self._jobs.setdefault(trial_id, f"trial-{len(self._jobs)}")

    def acquire(self, trial_id: str, timeout: float) -> tuple[int, dict[str, str]] | None:
        """(lease, GPU) for the trial, waiting up to `timeout` seconds; `None` if none came."""
        slot = self._gpus.acquire(timeout)
        if slot is None:
            return None
        self._held[trial_id] = slot
        return slot.lease, dataclasses.asdict(slot.gpu)

    def deadline(self, trial_id: str) -> float:
        return self._held[trial_id].deadline

    def give_back(self, trial_id: str) -> None:
        """The trial stopped using its GPU (it may already have been given back)."""
        slot = self._held.pop(trial_id, None)
        if slot is not None:
            self._gpus.give_back(slot)

    def trial_completed(self, trial_id: str) -> None:
        """The trainable returned and its run reported the job done: Tune's end of the trial
        reports nothing more."""
        self._completed.add(trial_id)

    def trial_ended(self, trial_id: str, iterations: int) -> None:
        """Tune ended the trial: its GPU goes back, and unless the trainable returned, the job is
        reported at `iterations`, stopped early if short of the maximum (the scheduler stopped
        it, or it failed)."""
        self.give_back(trial_id)
        job = self._jobs.get(trial_id)
        if job is not None and trial_id not in self._completed:
            stopped = iterations < self._max_iterations
            # Tune may stop the trainable after its last step's report ended the job and, if it
            # was the app's last, the app: the arbiter answers this repeat as it did the first.
            self._client.report_progress(self._app, [models.JobProgress(job, iterations, stopped=stopped)])

    def stop(self) -> None:
        self._gpus.stop()
        self._client.close()


class _BrokeredSlot:
    """A `GpuSlot` in a trial's worker whose deadline the broker keeps (revocations move it)."""

    def __init__(self, broker: Any, trial_id: str, lease: int, gpu: models.LeasedGpu) -> None:
        self._broker = broker
        self._trial_id = trial_id
        self.lease = lease
        self.gpu = gpu

    @property
    def deadline(self) -> float:
        return ray.get(self._broker.deadline.remote(self._trial_id))

    @property
    def cuda_visible_devices(self) -> str:
        return self.gpu.cuda_uuid


class _EndedTrials(tune.Callback):
    """Tells the broker when Tune ends a trial (completed, stopped by the scheduler, failed)."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial)

    def _ended(self, trial: Any) -> None:
        iterations = int((trial.last_result or {}).get(ITERATIONS_METRIC, 0))
        ray.get(self._broker.trial_ended.remote(trial.trial_id, iterations))


Trainable = Callable[[dict[str, Any], AgoraTuneTrial], None]


def run_tune(
    trainable: Trainable,
    *,
    base_url: str,
    token: str,
    app_name: str,
    param_space: dict[str, Any],
    num_samples: int,
    metric: str,
    mode: str,
    max_iterations: int,
    seconds_per_iteration: float,
    grace_period: int | None = None,
    reduction_factor: int = 4,
    resources_per_trial: dict[str, float] | None = None,
    checkpoint_dir: str | None = None,
    storage_path: str | None = None,
    min_time_left: float = 1.0,
    acquire_timeout: float = 600.0,
) -> tuple[models.App, tune.ResultGrid]:
    """Registers the search as an Agora app and runs `num_samples` Tune trials on its leased
    GPUs, one GPU each; `grace_period` set: successive halving (ASHA) with that minimum and
    `reduction_factor`. Ray must be initialised (`ray.init()`) on one machine: trials share
    checkpoints through `checkpoint_dir`; Tune's results go to `storage_path` (default
    `~/ray_results`). The app is finished at the end, whatever happened."""
    halving = None if grace_period is None else (grace_period, reduction_factor)
    spec = search_spec(
        n_trials=num_samples,
        max_iterations=max_iterations,
        seconds_per_iteration=seconds_per_iteration,
        halving=halving,
    )
    with Client(base_url, token) as client:
        app = client.register_app(models.RegisterApp(name=app_name, app=spec))
        broker = (
            ray.remote(AgoraBroker)
            .options(max_concurrency=max(8, 2 * num_samples), num_cpus=0)
            .remote(base_url, token, app.id, max_iterations, min_time_left)
        )
        checkpoints = checkpoint_dir or tempfile.mkdtemp(prefix=f"agora-{app.id}-")
        try:
            scheduler = (
                FIFOScheduler()
                if halving is None
                else ASHAScheduler(
                    time_attr=ITERATIONS_METRIC,
                    max_t=max_iterations,
                    grace_period=grace_period,
                    reduction_factor=reduction_factor,
                )
            )
            leased = _on_leased_gpus(
                trainable, broker, base_url, token, app.id, max_iterations, checkpoints, acquire_timeout
            )
            tuner = tune.Tuner(
                tune.with_resources(leased, resources_per_trial or {"cpu": 1}),
                param_space=param_space,
                tune_config=tune.TuneConfig(
                    num_samples=num_samples, scheduler=scheduler, metric=metric, mode=mode
                ),
                run_config=tune.RunConfig(
                    name=app_name, storage_path=storage_path, callbacks=[_EndedTrials(broker)], verbose=0
                ),
            )
            results = tuner.fit()
        finally:
            ray.get(broker.stop.remote())
            client.finish_app(app.id)  # Also when every job had ended and the app with them.
    return app, results


def _on_leased_gpus(
    trainable: Trainable,
    broker: Any,
    base_url: str,
    token: str,
    app: int,
    max_iterations: int,
    checkpoint_dir: str,
    acquire_timeout: float,
) -> Callable[[dict[str, Any]], None]:
    """The Tune function trainable: runs `trainable` on leased GPUs, attempt after attempt,
    until it returns."""

    def leased(config: dict[str, Any]) -> None:
        trial_id = tune.get_context().get_trial_id()
        job = ray.get(broker.job_of.remote(trial_id))
        checkpoints = Checkpoints(checkpoint_dir)
        with Client(base_url, token) as client:
            while True:
                granted = ray.get(broker.acquire.remote(trial_id, acquire_timeout))
                if granted is None:
                    raise TimeoutError(f"app {app}: no leased GPU came in {acquire_timeout} s for {job}")
                lease, gpu = granted
                run = TrialRun(
                    client,
                    app,
                    job,
                    max_iterations,
                    _BrokeredSlot(broker, trial_id, lease, models.LeasedGpu(**gpu)),
                    checkpoints,
                )  # type: ignore[arg-type]
                try:
                    trainable(config, AgoraTuneTrial(run))
                except LeaseEnding:
                    continue
                finally:
                    ray.get(broker.give_back.remote(trial_id))
                run.complete()
                ray.get(broker.trial_completed.remote(trial_id))
                return

    return leased
