"""Typed models of the arbiter's JSON, one dataclass per OpenAPI schema.

Answers (`App`, `Lease`, ...) name their schema in `SCHEMA`; requests (`RegisterApp`,
`ProgressReport`, `Bid`) too. `tests/test_openapi.py` compares every one of them with the
`/openapi.json` a real `agora serve` serves (field names, required and nullable fields), so a
change of the API that these models do not follow fails the client's tests.

The search descriptions (`Job`, `SuccessiveHalving`, ...) are the engine's app format
(`docs/simulator-inputs.md`); the arbiter refuses unknown fields, and the tests register each
kind against a real arbiter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as the arbiter writes it (`2026-11-21T09:00:00.000Z`), timezone-aware."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _optional_time(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def to_json(value: Any) -> Any:
    """A request model as JSON: dataclasses as objects without their unset optional fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        body: dict[str, Any] = {}
        for item in dataclasses.fields(value):
            field_value = getattr(value, item.name)
            if field_value is None and item.metadata.get("omit_none", True):
                continue
            body[item.metadata.get("json", item.name)] = to_json(field_value)
        return {**value.TAG, **body} if hasattr(value, "TAG") else body
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value


# --- answers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tenant:
    """A tenant just created, with its first API token (shown once)."""

    SCHEMA: ClassVar[str] = "TenantCreated"
    id: int
    name: str
    token: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Tenant:
        return cls(id=body["id"], name=body["name"], token=body["token"])


@dataclass(frozen=True)
class App:
    """A registered app (one hyper-parameter search)."""

    SCHEMA: ClassVar[str] = "AppRow"
    id: int
    tenant_id: int
    name: str
    kind: str
    bidding: str
    arrived_at: datetime
    finished_at: datetime | None
    jobs: tuple[JobPhase, ...]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> App:
        return cls(
            id=body["id"],
            tenant_id=body["tenant_id"],
            name=body["name"],
            kind=body["kind"],
            bidding=body["bidding"],
            arrived_at=parse_time(body["arrived_at"]),
            finished_at=_optional_time(body["finished_at"]),
            jobs=tuple(JobPhase.from_json(job) for job in body["jobs"]),
        )


@dataclass(frozen=True)
class SpeedChange:
    """From iteration `at_iteration` on, an iteration of the job takes `serial_iteration_time`
    seconds on one GPU (iterations of its first batch size's samples)."""

    SCHEMA: ClassVar[str] = "SpeedChange"
    at_iteration: int
    serial_iteration_time: float

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SpeedChange:
        return cls(at_iteration=body["at_iteration"], serial_iteration_time=body["serial_iteration_time"])


@dataclass(frozen=True)
class JobPhase:
    """Where a job stands in its speed schedule: `phase` 0 before its first change, `i` from its
    `i`-th on, of `phases`; `next_change` is None in the last phase."""

    SCHEMA: ClassVar[str] = "JobPhase"
    job: str
    completed_iterations: int
    phase: int
    phases: int
    serial_iteration_time: float
    next_change: SpeedChange | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> JobPhase:
        following = body["next_change"]
        return cls(
            job=body["job"],
            completed_iterations=body["completed_iterations"],
            phase=body["phase"],
            phases=body["phases"],
            serial_iteration_time=body["serial_iteration_time"],
            next_change=None if following is None else SpeedChange.from_json(following),
        )


@dataclass(frozen=True)
class SpeedChangeAck:
    """The answer to a speed change: the job's schedule after it, and the phase it is in."""

    SCHEMA: ClassVar[str] = "SpeedChangeAck"
    speed_changes: tuple[SpeedChange, ...]
    phase: JobPhase

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SpeedChangeAck:
        return cls(
            speed_changes=tuple(SpeedChange.from_json(change) for change in body["speed_changes"]),
            phase=JobPhase.from_json(body["phase"]),
        )


@dataclass(frozen=True)
class LeasedGpu:
    """One GPU of a lease: Agora's id, its host, the CUDA UUID for `CUDA_VISIBLE_DEVICES`, and
    its GPU type (`h100`)."""

    SCHEMA: ClassVar[str] = "LeasedGpu"
    id: str
    host: str
    cuda_uuid: str
    gpu_type: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LeasedGpu:
        return cls(id=body["id"], host=body["host"], cuda_uuid=body["cuda_uuid"], gpu_type=body["gpu_type"])


@dataclass(frozen=True)
class Lease:
    """A lease of GPUs to an app: `active` until `end_at`, then `expired`, `released` or
    `revoked` (at `ended_at`); `cpus` and `memory_gib` are the CPU cores and host memory (GiB)
    that come with it as the latest round divided them (`None` where the hosts do not report
    them)."""

    SCHEMA: ClassVar[str] = "LeaseView"
    id: int
    app_id: int
    round_id: int
    gpus: tuple[LeasedGpu, ...]
    start_at: datetime
    end_at: datetime
    state: str
    ended_at: datetime | None
    cpus: float | None
    memory_gib: float | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Lease:
        return cls(
            id=body["id"],
            app_id=body["app_id"],
            round_id=body["round_id"],
            gpus=tuple(LeasedGpu.from_json(gpu) for gpu in body["gpus"]),
            start_at=parse_time(body["start_at"]),
            end_at=parse_time(body["end_at"]),
            state=body["state"],
            ended_at=_optional_time(body["ended_at"]),
            cpus=body["cpus"],
            memory_gib=body["memory_gib"],
        )

    @property
    def cuda_visible_devices(self) -> str:
        """The lease's GPUs as `CUDA_VISIBLE_DEVICES` expects them (comma-separated UUIDs)."""
        return ",".join(gpu.cuda_uuid for gpu in self.gpus)


@dataclass(frozen=True)
class ThroughputAck:
    """The answer to a throughput report: the app's speed per GPU type from now on."""

    SCHEMA: ClassVar[str] = "ThroughputAck"
    throughput: dict[str, float]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ThroughputAck:
        return cls(throughput=dict(body["throughput"]))


@dataclass(frozen=True)
class ProgressAck:
    """The answer to a progress report: `finished` when the app has nothing left to run."""

    SCHEMA: ClassVar[str] = "ProgressAck"
    finished: bool

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ProgressAck:
        return cls(finished=body["finished"])


@dataclass(frozen=True)
class BidAck:
    """A stored bid; `replayed` when a retry with the same Idempotency-Key stored nothing new."""

    SCHEMA: ClassVar[str] = "BidAck"
    bid_id: int
    round: int
    replayed: bool

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BidAck:
        return cls(bid_id=body["bid_id"], round=body["round"], replayed=body["replayed"])


@dataclass(frozen=True)
class DrainAck:
    """A GPU taken out of (or put back into) service, the lease it ends and when."""

    SCHEMA: ClassVar[str] = "DrainAck"
    gpu: str
    lease: int | None
    revoke_at: datetime

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> DrainAck:
        return cls(gpu=body["gpu"], lease=body["lease"], revoke_at=parse_time(body["revoke_at"]))


@dataclass(frozen=True)
class RoundSummary:
    """One round in the round history."""

    SCHEMA: ClassVar[str] = "RoundSummary"
    round_id: int
    opened_at: datetime
    closed_at: datetime | None
    status: str
    offered_gpus: int
    bidders: int
    bids: int
    gpus_won_in_auction: int
    gpus_as_leftovers: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RoundSummary:
        return cls(
            round_id=body["round_id"],
            opened_at=parse_time(body["opened_at"]),
            closed_at=_optional_time(body["closed_at"]),
            status=body["status"],
            offered_gpus=body["offered_gpus"],
            bidders=body["bidders"],
            bids=body["bids"],
            gpus_won_in_auction=body["gpus_won_in_auction"],
            gpus_as_leftovers=body["gpus_as_leftovers"],
        )


@dataclass(frozen=True)
class ClusterGpu:
    """One GPU of the cluster; `lease_id` and `app_id` are `None` when free or another
    tenant's. `product_name` and `compute_capability` are what a GPU host's NVML reported
    (`None` in a simulated fleet); `gpu_type` is the type the name maps to."""

    SCHEMA: ClassVar[str] = "GpuView"
    id: str
    machine: int
    rack: int
    host: str
    slot: int
    gpu_type: str
    product_name: str | None
    compute_capability: str | None
    cuda_uuid: str
    healthy: bool
    lease_id: int | None
    app_id: int | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ClusterGpu:
        return cls(**{item.name: body[item.name] for item in dataclasses.fields(cls)})


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseGranted:
    """`lease_granted`: the app holds `gpus` (Agora ids) from `start` to `end`."""

    lease: int
    round: int
    gpus: tuple[str, ...]
    start: datetime
    end: datetime

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LeaseGranted:
        return cls(
            lease=body["lease"],
            round=body["round"],
            gpus=tuple(body["gpus"]),
            start=parse_time(body["start"]),
            end=parse_time(body["end"]),
        )


@dataclass(frozen=True)
class RevocationNotice:
    """`revocation_notice`: `gpu` leaves service; lease `lease` is revoked at `revoke_at`, so
    checkpoint before then."""

    lease: int
    gpu: str
    revoke_at: datetime
    reason: str | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RevocationNotice:
        return cls(
            lease=body["lease"],
            gpu=body["gpu"],
            revoke_at=parse_time(body["revoke_at"]),
            reason=body.get("reason"),
        )


@dataclass(frozen=True)
class LeaseEnded:
    """`lease_ended`: the lease is over (`expired`, `released` or `revoked`)."""

    lease: int
    state: str
    gpus: tuple[str, ...]
    reason: str | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LeaseEnded:
        return cls(
            lease=body["lease"],
            state=body["state"],
            gpus=tuple(body["gpus"]),
            reason=body.get("reason"),
        )


EventData = LeaseGranted | RevocationNotice | LeaseEnded | dict
"""An event's payload: typed for lease events, the raw JSON object for offers and results."""

_EVENT_TYPES: dict[str, Any] = {
    "lease_granted": LeaseGranted,
    "revocation_notice": RevocationNotice,
    "lease_ended": LeaseEnded,
}


@dataclass(frozen=True)
class Event:
    """One event of an app's stream, in order: `offer`, `round_result`, `lease_granted`,
    `revocation_notice`, `lease_ended`. `id` orders them; resume after it."""

    SCHEMA: ClassVar[str] = "AppEventRow"
    id: int
    kind: str
    data: EventData = field(metadata={"json": "payload"})
    at: datetime | None = None

    @classmethod
    def parse(cls, id: int, kind: str, payload: dict[str, Any], at: str | None = None) -> Event:
        parser = _EVENT_TYPES.get(kind)
        data = parser.from_json(payload) if parser else payload
        return cls(id=id, kind=kind, data=data, at=_optional_time(at))


# --- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementSlowdown:
    """How much slower an iteration runs when the job's GPUs are spread out (each >= 1)."""

    same_slot: float = 1.0
    same_machine: float = 1.0
    same_rack: float = 1.0
    cross_rack: float = 1.0


@dataclass(frozen=True)
class Job:
    """One training job (a trial): its length in iterations and their serial time on one GPU."""

    id: str
    total_iterations: int
    serial_iteration_time: float
    max_gpus: int = 1
    completed_iterations: int = 0
    slowdown: PlacementSlowdown | None = None
    stopped: bool = False
    # How its speed changes as it trains (batch-size scaling), in increasing `at_iteration`.
    speed_changes: list[SpeedChange] | None = None


@dataclass(frozen=True)
class SingleJob:
    """An app of one job that runs to its end."""

    TAG: ClassVar[dict[str, str]] = {"kind": "single_job"}
    job: Job


@dataclass(frozen=True)
class SuccessiveHalving:
    """A successive-halving search (Hyperband's brackets): phase p runs `jobs_per_phase[p]` jobs
    for `phase_iterations[p]` more iterations each; the framework stops the rest."""

    TAG: ClassVar[dict[str, str]] = {"kind": "successive_halving"}
    budget_gpu_seconds: float
    phase_iterations: list[int]
    jobs_per_phase: list[int]
    jobs: list[Job]
    max_gpus_per_phase: list[int] | None = None
    current_phase: int = 0


@dataclass(frozen=True)
class CurveJob:
    """A job of a performance-curve search and the iteration it is predicted to stop at."""

    job: Job
    predicted_final_iteration: int


@dataclass(frozen=True)
class PerformanceCurve:
    """A search that stops each job where its learning curve predicts (median stopping, ...)."""

    TAG: ClassVar[dict[str, str]] = {"kind": "performance_curve"}
    jobs: list[CurveJob]


AppSpec = SingleJob | SuccessiveHalving | PerformanceCurve


@dataclass(frozen=True)
class RegisterApp:
    """The body of `POST /v1/apps`."""

    SCHEMA: ClassVar[str] = "RegisterBody"
    name: str
    app: AppSpec
    bidding: Literal["agent", "explicit"] = "agent"
    enforcement: dict[str, Any] | None = None


Locality = Literal["same_slot", "same_machine", "same_rack", "cross_rack"]


@dataclass(frozen=True)
class Observed:
    """A measured iteration time: `seconds_per_iteration` on `gpus` GPUs placed at
    `locality`."""

    locality: Locality
    gpus: int
    seconds_per_iteration: float


@dataclass(frozen=True)
class JobProgress:
    """One job's progress: iterations done (never fewer than before), stopped early or not."""

    job: str
    completed_iterations: int
    stopped: bool = False
    observed: Observed | None = None


@dataclass(frozen=True)
class ProgressReport:
    """The body of `POST /v1/apps/{app}/progress`."""

    SCHEMA: ClassVar[str] = "ProgressBody"
    jobs: list[JobProgress]


@dataclass(frozen=True)
class ThroughputReport:
    """The body of `POST /v1/apps/{app}/throughput`: the app measured at `speed` on GPUs of type
    `gpu_type`, relative to the speed its `serial_iteration_time`s were measured at (1.0)."""

    SCHEMA: ClassVar[str] = "ThroughputReport"
    gpu_type: str
    speed: float


@dataclass(frozen=True)
class SpeedChangeReport:
    """The body of `POST /v1/apps/{app}/speed-changes`: from iteration `at_iteration` on, an
    iteration of `job` takes `serial_iteration_time` seconds on one GPU."""

    SCHEMA: ClassVar[str] = "SpeedChangeReport"
    job: str
    at_iteration: int
    serial_iteration_time: float


@dataclass(frozen=True)
class BidEntry:
    """One row of a bid table: a bundle of offered GPUs and the app's rho if it wins it."""

    SCHEMA: ClassVar[str] = "BidEntryBody"
    gpus: list[str]
    rho: float


@dataclass(frozen=True)
class Bid:
    """The body of `POST /v1/rounds/{round}/bids`. `rho_old` is `None` when the app holds no
    GPU (starving); it is sent as `null`, never left out."""

    SCHEMA: ClassVar[str] = "BidBody"
    app: int
    rho_old: float | None = field(metadata={"omit_none": False})
    bids: list[BidEntry]
