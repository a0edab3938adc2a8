"""Optuna studies whose trials run on GPUs leased from Agora.

The study is an Agora app and each trial one of its jobs (`trial-0`, `trial-1`, ...). The
app's shape comes from the study's pruner: Optuna's `SuccessiveHalvingPruner` and
`HyperbandPruner` are Themis's successive-halving apps (phases of rungs, jobs divided by the
reduction factor at each), any other pruner a performance-curve app whose jobs may each run to
`max_iterations`. The arbiter's agent bids for the app from the progress the trials report, so
the search gets a fair share of the cluster without computing rho itself.

```python
def objective(trial: optuna.Trial, run: AgoraTrial) -> float:
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    state = run.restore() or {"epoch": 0, "model": new_model(lr)}
    while state["epoch"] < 27:
        loss = train_one_epoch(state["model"], device=run.cuda_visible_devices)
        state["epoch"] += 1
        run.report(loss, state["epoch"], checkpoint=state)  # may raise TrialPruned or LeaseEnding
    return loss

result = run_study(study, objective, client=agora, app_name="mlp-hyperband", n_trials=16,
                   max_iterations=27, seconds_per_iteration=0.5)
```

A trial starts only on a GPU of an active lease; `run.report` checkpoints, reports progress
to Optuna (intermediate value, pruning) and to Agora, and stops the trial (`LeaseEnding`)
before its lease ends or is revoked. The trial stays RUNNING in Optuna and resumes from its
checkpoint on the next GPU the app is granted.
"""

from __future__ import annotations

import math
import tempfile
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import optuna

from . import models
from .client import Client
from .trials import Checkpoints, GpuSlot, LeasedGpus, LeaseEnding, RunInterval, TrialRun, search_spec

RUNS_ATTR = "agora_runs"
"""The trial user attribute listing where and when the trial ran: `[[lease, gpu, start, stop]]`."""
JOB_ATTR = "agora_job"
"""The trial user attribute naming the trial's Agora job."""


class AgoraTrial:
    """What an objective sees of its place on the cluster (see the module's example)."""

    def __init__(self, trial: optuna.Trial, run: TrialRun) -> None:
        self._trial = trial
        self._run = run

    @property
    def cuda_visible_devices(self) -> str:
        """The leased GPU, as `CUDA_VISIBLE_DEVICES` expects (its CUDA UUID)."""
        return self._run.cuda_visible_devices

    @property
    def gpus(self) -> tuple[models.LeasedGpu, ...]:
        return self._run.gpus

    @property
    def lease(self) -> int:
        return self._run.lease

    def restore(self) -> Any | None:
        """The last checkpoint this trial reported, or `None` on its first run."""
        return self._run.restore()

    def report(self, value: float, iterations: int, *, checkpoint: Any) -> None:
        """After `iterations` in all: saves `checkpoint`, reports `value` to Optuna and the
        progress to Agora; raises `optuna.TrialPruned` when the pruner stops the trial and
        `LeaseEnding` when its lease leaves no time for another step."""
        if not math.isfinite(value):
            raise ValueError(f"trial {self._run.job}: reported value must be finite, got {value}")
        self._trial.report(value, iterations)
        if self._trial.should_prune():
            self._run.iterations = iterations
            raise optuna.TrialPruned(f"pruned at iteration {iterations} with value {value}")
        self._run.step(iterations, checkpoint)


Objective = Callable[[optuna.Trial, AgoraTrial], float]


@dataclass
class StudyResult:
    """What `run_study` did: the Agora app, each trial's job and run intervals, the leases."""

    app: models.App
    jobs: dict[int, str] = field(default_factory=dict)
    runs: dict[int, list[RunInterval]] = field(default_factory=dict)
    leases: list[models.Lease] = field(default_factory=list)
    preemptions: int = 0


def app_spec(
    pruner: optuna.pruners.BasePruner,
    *,
    n_trials: int,
    max_iterations: int,
    seconds_per_iteration: float,
) -> models.AppSpec:
    """The Agora app describing a search of `n_trials` trials of at most `max_iterations` each,
    pruned by `pruner` (`trials.search_spec`). Hyperband runs several successive-halving
    brackets; the app is its most aggressive one (the smallest minimum resource), whose plan the
    arbiter refines from the reported progress."""
    return search_spec(
        n_trials=n_trials,
        max_iterations=max_iterations,
        seconds_per_iteration=seconds_per_iteration,
        halving=_halving_of(pruner),
    )


def _halving_of(pruner: optuna.pruners.BasePruner) -> tuple[int, int] | None:
    """(minimum resource, reduction factor) of a successive-halving or Hyperband pruner."""
    if isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner):
        minimum = pruner._min_resource
        factor = pruner._reduction_factor
        rate = pruner._min_early_stopping_rate
        minimum = 1 if minimum == "auto" else minimum * factor**rate
        return int(minimum), int(factor)
    if isinstance(pruner, optuna.pruners.HyperbandPruner):
        return int(pruner._min_resource), int(pruner._reduction_factor)
    return None


def run_study(
    study: optuna.Study,
    objective: Objective,
    *,
    client: Client,
    app_name: str,
    n_trials: int,
    max_iterations: int,
    seconds_per_iteration: float,
    max_parallel: int = 8,
    checkpoint_dir: str | None = None,
    min_time_left: float = 1.0,
    acquire_timeout: float = 600.0,
) -> StudyResult:
    """Registers the study as an Agora app and runs `n_trials` trials on its leased GPUs, one GPU
    each and at most `max_parallel` at once, until every trial is complete, pruned or failed.

    `seconds_per_iteration` is the expected time of one iteration on one GPU (the arbiter's
    first estimate; the trials' measured times replace it). A trial starts only on a GPU with at
    least `min_time_left` seconds of lease left. Raises `TimeoutError` when no GPU comes for
    `acquire_timeout` seconds. The app is finished at the end, whatever happened.
    """
    spec = app_spec(
        study.pruner,
        n_trials=n_trials,
        max_iterations=max_iterations,
        seconds_per_iteration=seconds_per_iteration,
    )
    app = client.register_app(models.RegisterApp(name=app_name, app=spec))
    result = StudyResult(app=app)
    gpus = LeasedGpus(client, app.id, min_time_left=min_time_left)
    checkpoints = Checkpoints(checkpoint_dir or tempfile.mkdtemp(prefix=f"agora-{app.id}-"))
    runner = _Runner(study, objective, client, app.id, max_iterations, gpus, checkpoints, result)
    gpus.start()
    try:
        runner.run(n_trials, max_parallel, acquire_timeout)
    finally:
        gpus.stop()
        client.finish_app(app.id)  # Also when every job had ended and the app with them.
        result.leases = client.leases(app.id)
    return result


class _Runner:
    """Hands leased GPUs to trials: preempted trials first (they resume), then new ones."""

    def __init__(
        self,
        study: optuna.Study,
        objective: Objective,
        client: Client,
        app: int,
        max_iterations: int,
        gpus: LeasedGpus,
        checkpoints: Checkpoints,
        result: StudyResult,
    ) -> None:
        self.study = study
        self.objective = objective
        self.client = client
        self.app = app
        self.max_iterations = max_iterations
        self.gpus = gpus
        self.checkpoints = checkpoints
        self.result = result

    def run(self, n_trials: int, max_parallel: int, acquire_timeout: float) -> None:
        waiting: deque[optuna.Trial] = deque()
        running: dict[Future[str], optuna.Trial] = {}
        asked = 0
        with ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="agora-trial") as pool:
            while asked < n_trials or waiting or running:
                for done in [future for future in running if future.done()]:
                    trial = running.pop(done)
                    if done.result() == "preempted":
                        self.result.preemptions += 1
                        waiting.append(trial)
                if len(running) >= max_parallel or not (waiting or asked < n_trials):
                    wait(running, return_when=FIRST_COMPLETED)
                    continue
                slot = self.gpus.acquire(timeout=0.2 if running else acquire_timeout)
                if slot is None:
                    if not running:
                        raise TimeoutError(f"app {self.app}: no leased GPU came in {acquire_timeout} s")
                    continue
                if not waiting:
                    waiting.append(self._ask(asked))
                    asked += 1
                trial = waiting.popleft()
                running[pool.submit(self._attempt, trial, slot)] = trial

    def _ask(self, index: int) -> optuna.Trial:
        trial = self.study.ask()
        job = f"trial-{index}"
        trial.set_user_attr(JOB_ATTR, job)
        self.result.jobs[trial.number] = job
        return trial

    def _attempt(self, trial: optuna.Trial, slot: GpuSlot) -> str:
        """Runs the trial on `slot` until it ends or its lease does: `"told"` or `"preempted"`."""
        run = TrialRun(
            self.client, self.app, self.result.jobs[trial.number], self.max_iterations, slot, self.checkpoints
        )
        failure: BaseException | None = None
        try:
            value = self.objective(trial, AgoraTrial(trial, run))
        except BaseException as error:  # Sorted out below, once the GPU is given back.
            failure = error
        finally:
            run.finish()
            self.gpus.give_back(slot)
        self._record(trial, run)
        if isinstance(failure, LeaseEnding):
            return "preempted"
        if isinstance(failure, optuna.TrialPruned):
            run.stop()
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif failure is not None:
            run.stop()
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise failure
        else:
            run.complete()
            self.study.tell(trial, value)
        return "told"

    def _record(self, trial: optuna.Trial, run: TrialRun) -> None:
        interval = run.interval()
        self.result.runs.setdefault(trial.number, []).append(interval)
        trial.set_user_attr(
            RUNS_ATTR, [[r.lease, r.gpu, r.started, r.stopped] for r in self.result.runs[trial.number]]
        )
