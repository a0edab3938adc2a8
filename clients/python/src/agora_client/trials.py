"""Trials on leased GPUs, whatever the search framework: the app's GPUs as its leases grant them
(`LeasedGpus`), and one trial's run on one of them (`TrialRun`): it checkpoints, reports
progress to the arbiter, and stops before its lease does.

A trial runs only while it holds a lease: it starts on a GPU of an active lease with time left,
and `TrialRun.step` raises `LeaseEnding` once the lease (or a revocation notice) leaves less than
the next step's time, after the step's checkpoint is saved. The framework's runner then puts
the trial back in line; it resumes from its checkpoint on the next GPU it gets.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import models
from .client import Client
from .errors import AgoraError

Clock = Callable[[], float]
"""Seconds since the epoch (`time.time`)."""


class LeaseEnding(AgoraError):
    """The trial's lease ends (or was given notice) before its next step could finish: its
    checkpoint is saved and it must stop now. Runners catch it; objectives let it through."""


def _seconds(moment: datetime) -> float:
    return moment.astimezone(timezone.utc).timestamp()


@dataclass
class GpuSlot:
    """One leased GPU that a trial may run on until `deadline` (seconds since the epoch): the
    lease's end, or the revocation time a notice gave."""

    lease: int
    gpu: models.LeasedGpu
    deadline: float
    noticed: bool = False

    @property
    def cuda_visible_devices(self) -> str:
        return self.gpu.cuda_uuid


class LeasedGpus:
    """Follows an app's events in a background thread and keeps its leased GPUs: which are
    free, which trial holds which, and until when.

    `acquire` hands out a free GPU of an active lease that has at least `min_time_left` seconds
    to run; a revocation notice moves its slot's deadline forward, and a lease's end makes it
    zero, so the trial on it stops at its next step.
    """

    def __init__(
        self,
        client: Client,
        app: int,
        *,
        min_time_left: float = 1.0,
        clock: Clock = time.time,
        poll_timeout_ms: int = 2_000,
    ) -> None:
        self._client = client
        self._app = app
        self._min_time_left = min_time_left
        self._clock = clock
        self._poll_timeout_ms = poll_timeout_ms
        self._changed = threading.Condition()
        self._free: list[GpuSlot] = []
        self._held: list[GpuSlot] = []
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, name=f"agora-app-{app}-events", daemon=True)
        self.granted: list[models.Lease] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def acquire(self, timeout: float) -> GpuSlot | None:
        """A free GPU with enough time left, waiting up to `timeout` seconds; `None` if none."""
        deadline = self._clock() + timeout
        with self._changed:
            while True:
                self._raise_failure()
                now = self._clock()
                self._free = [slot for slot in self._free if slot.deadline - now >= self._min_time_left]
                if self._free:
                    slot = self._free.pop(0)
                    self._held.append(slot)
                    return slot
                if now >= deadline:
                    return None
                self._changed.wait(min(deadline - now, 0.5))

    def give_back(self, slot: GpuSlot) -> None:
        """The trial on `slot` stopped; the GPU is free for another while its lease lasts."""
        with self._changed:
            self._held.remove(slot)
            if not slot.noticed:
                self._free.append(slot)
            self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise AgoraError(f"following app {self._app}'s events failed: {self._failure}") from self._failure

    def _follow(self) -> None:
        after = 0
        try:
            while not self._stop.is_set():
                events, after = self._client.poll_events(self._app, after, self._poll_timeout_ms)
                for event in events:
                    self._apply(event.data)
        except BaseException as error:  # Surfaced to the runner by acquire.
            with self._changed:
                self._failure = error
                self._changed.notify_all()

    def _apply(self, data: models.EventData) -> None:
        if isinstance(data, models.LeaseGranted):
            lease = next(lease for lease in self._client.leases(self._app) if lease.id == data.lease)
            with self._changed:
                self.granted.append(lease)
                self._free.extend(GpuSlot(lease.id, gpu, _seconds(lease.end_at)) for gpu in lease.gpus)
                self._changed.notify_all()
        elif isinstance(data, models.RevocationNotice):
            # The whole lease is revoked, not only the GPU that leaves service.
            self._end_slots(data.lease, _seconds(data.revoke_at))
        elif isinstance(data, models.LeaseEnded):
            self._end_slots(data.lease, self._clock())

    def _end_slots(self, lease: int, at: float) -> None:
        with self._changed:
            for slot in self._free + self._held:
                if slot.lease == lease:
                    slot.deadline = min(slot.deadline, at)
                    slot.noticed = True
            self._free = [slot for slot in self._free if not slot.noticed]
            self._changed.notify_all()


class Checkpoints:
    """Trials' checkpoints as pickles in a folder, one file per trial, written atomically: the
    iterations done and the objective's state."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def save(self, job: str, iterations: int, state: Any) -> None:
        path = self.folder / f"{job}.pickle"
        partial = path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps((iterations, state)))
        partial.replace(path)

    def load(self, job: str) -> tuple[int, Any] | None:
        """(iterations, state) of the job's last checkpoint, or `None`."""
        path = self.folder / f"{job}.pickle"
        return pickle.loads(path.read_bytes()) if path.exists() else None


@dataclass(frozen=True)
class RunInterval:
    """When a trial ran, on which GPU of which lease (seconds since the epoch)."""

    lease: int
    gpu: str
    started: float
    stopped: float


@dataclass
class TrialRun:
    """One attempt of a trial on one leased GPU: what the objective sees.

    The objective calls `restore()` once for its last checkpoint (`None` on a first run) and
    `step()` after each unit of work (an epoch, say) with the iterations done so far and a
    checkpoint. `step` saves the checkpoint, reports progress to the arbiter, and raises
    `LeaseEnding` when the lease would end before another step of the same length could finish.
    The runner ends the job with `complete()` once the objective returns, or `stop()` once it
    was pruned or failed.
    """

    client: Client
    app: int
    job: str
    total_iterations: int
    slot: GpuSlot
    checkpoints: Checkpoints
    clock: Clock = time.time
    progress_interval: float = 1.0
    started: float = field(default=0.0)
    _last_step_at: float = field(default=0.0)
    _last_report_at: float = field(default=float("-inf"))
    _finished_at: float | None = None
    _ended_on_arbiter: bool = False
    iterations: int = 0

    def __post_init__(self) -> None:
        self.started = self._last_step_at = self.clock()
        saved = self.checkpoints.load(self.job)
        self.iterations = saved[0] if saved else 0

    @property
    def gpus(self) -> tuple[models.LeasedGpu, ...]:
        return (self.slot.gpu,)

    @property
    def lease(self) -> int:
        return self.slot.lease

    @property
    def cuda_visible_devices(self) -> str:
        """The GPU to use, as `CUDA_VISIBLE_DEVICES` expects (its CUDA UUID)."""
        return self.slot.cuda_visible_devices

    def restore(self) -> Any | None:
        """The trial's last checkpoint, or `None` if it never saved one."""
        saved = self.checkpoints.load(self.job)
        return saved[1] if saved else None

    def step(self, iterations: int, checkpoint: Any) -> None:
        """Records that `iterations` are done (in all, not since the last call) and saves
        `checkpoint`; raises `LeaseEnding` when there is no time for another step."""
        if not 0 <= iterations <= self.total_iterations:
            raise ValueError(
                f"trial {self.job}: iterations must lie in [0, {self.total_iterations}] "
                f"(the trial's declared length), got {iterations}"
            )
        now = self.clock()
        step_seconds = now - self._last_step_at
        done_now = iterations - self.iterations
        self.checkpoints.save(self.job, iterations, checkpoint)
        self.iterations, self._last_step_at = iterations, now
        # The arbiter hears of the last step before a stop, so that its plan starts from there.
        # A trial that has done all its iterations has no next step to stop before.
        ending = iterations < self.total_iterations and self.slot.deadline - now < step_seconds * 1.5 + 0.2
        if ending or now - self._last_report_at >= self.progress_interval:
            observed = None
            if done_now > 0 and step_seconds > 0:
                observed = models.Observed("same_slot", 1, step_seconds / done_now)
            self.report(stopped=False, observed=observed)
        if ending:
            raise LeaseEnding(
                f"trial {self.job}: lease {self.slot.lease} ends before another step; "
                f"checkpointed at {iterations}"
            )

    def report(self, *, stopped: bool, observed: models.Observed | None = None) -> models.ProgressAck:
        """Tells the arbiter how far the trial is (and whether it was stopped early)."""
        self._last_report_at = self.clock()
        progress = models.JobProgress(self.job, self.iterations, stopped=stopped, observed=observed)
        ack = self.client.report_progress(self.app, [progress])
        self._ended_on_arbiter = stopped or self.iterations == self.total_iterations
        return ack

    def complete(self) -> None:
        """The objective returned: the job is done, all its iterations."""
        self.iterations = self.total_iterations
        self._end(stopped=False)

    def stop(self) -> None:
        """The trial was pruned or failed: the job stops at the iterations done."""
        self._end(stopped=True)

    def _end(self, *, stopped: bool) -> None:
        # A job the arbiter already heard end must not be reported again: if it was the app's
        # last, the arbiter has finished the app and refuses further progress.
        if not self._ended_on_arbiter:
            self.report(stopped=stopped)

    def finish(self) -> None:
        """The attempt is over: the objective returned or raised."""
        self._finished_at = self.clock()

    def interval(self) -> RunInterval:
        """When and where the attempt ran (up to `finish`, or now while it runs)."""
        stopped = self._finished_at if self._finished_at is not None else self.clock()
        return RunInterval(self.slot.lease, self.slot.gpu.id, self.started, stopped)


def search_spec(
    *, n_trials: int, max_iterations: int, seconds_per_iteration: float, halving: tuple[int, int] | None
) -> models.AppSpec:
    """The Agora app of a search of `n_trials` jobs (`trial-0`, ...) of at most `max_iterations`
    each, taking `seconds_per_iteration` on one GPU.

    With `halving` = (minimum resource r, reduction factor eta), a successive-halving app: rungs
    r, r*eta, r*eta^2, ... below `max_iterations`, and phase p runs n / eta^p jobs up to the next
    rung. Without, a performance-curve app whose jobs may each run to `max_iterations`.
    """
    if n_trials < 1 or max_iterations < 1:
        raise ValueError(
            f"n_trials and max_iterations must be at least 1, got {n_trials} and {max_iterations}"
        )
    if not (math.isfinite(seconds_per_iteration) and seconds_per_iteration > 0):
        raise ValueError(f"seconds_per_iteration must be a finite number > 0, got {seconds_per_iteration}")
    jobs = [models.Job(f"trial-{index}", max_iterations, seconds_per_iteration) for index in range(n_trials)]
    if halving is None:
        return models.PerformanceCurve([models.CurveJob(job, max_iterations) for job in jobs])
    min_resource, factor = halving
    if min_resource < 1 or factor < 2:
        raise ValueError(
            "successive halving needs a minimum resource >= 1 and a reduction factor >= 2, "
            f"got {min_resource} and {factor}"
        )
    rungs = [0]
    while min_resource * factor ** (len(rungs) - 1) < max_iterations:
        rungs.append(min_resource * factor ** (len(rungs) - 1))
    rungs.append(max_iterations)
    phase_iterations = [later - earlier for earlier, later in zip(rungs, rungs[1:], strict=False)]
    jobs_per_phase = [max(1, math.ceil(n_trials / factor**phase)) for phase in range(len(phase_iterations))]
    budget = (
        sum(count * length for count, length in zip(jobs_per_phase, phase_iterations, strict=True))
        * seconds_per_iteration
    )
    return models.SuccessiveHalving(budget, phase_iterations, jobs_per_phase, jobs)
