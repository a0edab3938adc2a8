"""What the sync and async clients share: each endpoint as a `Call` (method, path, body, how to
read the answer, whether a retry is safe), the retry policy, answer decoding and the SSE parser.
The clients only send calls; nothing here does I/O."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from . import models
from .errors import ApiError, TransportError

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer.

    `replayable`: sending it twice has the effect of sending it once (a GET, a report of
    monotonic progress, a release, or a request carrying an Idempotency-Key), so it may be
    retried even when the first attempt may have reached the arbiter (a retried report that had
    finished the app is answered as the first was: docs/api.md).
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    replayable: bool = False


def _nothing(_: Any) -> None:
    return None


def _app(app: int) -> str:
    return f"/v1/apps/{int(app)}"


def create_tenant(name: str) -> Call[models.Tenant]:
    return Call("POST", "/v1/tenants", models.Tenant.from_json, body={"name": name})


def register_app(request: models.RegisterApp) -> Call[models.App]:
    return Call("POST", "/v1/apps", models.App.from_json, body=models.to_json(request))


def list_apps() -> Call[list[models.App]]:
    return Call("GET", "/v1/apps", lambda rows: [models.App.from_json(row) for row in rows], replayable=True)


def get_app(app: int) -> Call[models.App]:
    return Call("GET", _app(app), models.App.from_json, replayable=True)


def report_progress(app: int, jobs: list[models.JobProgress]) -> Call[models.ProgressAck]:
    body = models.to_json(models.ProgressReport(jobs=list(jobs)))
    return Call("POST", f"{_app(app)}/progress", models.ProgressAck.from_json, body=body, replayable=True)


def report_throughput(app: int, gpu_type: str, speed: float) -> Call[models.ThroughputAck]:
    body = models.to_json(models.ThroughputReport(gpu_type=gpu_type, speed=speed))
    return Call("POST", f"{_app(app)}/throughput", models.ThroughputAck.from_json, body=body, replayable=True)


def report_speed_change(
    app: int, job: str, at_iteration: int, serial_iteration_time: float
) -> Call[models.SpeedChangeAck]:
    body = models.to_json(models.SpeedChangeReport(job, at_iteration, serial_iteration_time))
    path = f"{_app(app)}/speed-changes"
    return Call("POST", path, models.SpeedChangeAck.from_json, body=body, replayable=True)


def finish_app(app: int) -> Call[None]:
    return Call("POST", f"{_app(app)}/finish", _nothing, replayable=True)


def app_leases(app: int) -> Call[list[models.Lease]]:
    return Call(
        "GET",
        f"{_app(app)}/leases",
        lambda rows: [models.Lease.from_json(row) for row in rows],
        replayable=True,
    )


def why(app: int) -> Call[dict[str, Any]]:
    return Call("GET", f"{_app(app)}/why", dict, replayable=True)


def poll_events(app: int, after: int, timeout_ms: int) -> Call[tuple[list[models.Event], int]]:
    def parse(page: dict[str, Any]) -> tuple[list[models.Event], int]:
        events = [
            models.Event.parse(row["id"], row["kind"], row["payload"], row["at"]) for row in page["events"]
        ]
        return events, page["last_id"]

    params = {"after": after, "timeout_ms": timeout_ms}
    return Call("GET", f"{_app(app)}/events/poll", parse, params=params, replayable=True)


def submit_bid(round_id: int, bid: models.Bid, idempotency_key: str | None) -> Call[models.BidAck]:
    # A key makes the bid safe to retry: a retry returns the first answer and stores nothing.
    key = idempotency_key or f"agora-client-{uuid.uuid4()}"
    return Call(
        "POST",
        f"/v1/rounds/{int(round_id)}/bids",
        models.BidAck.from_json,
        body=models.to_json(bid),
        headers={"Idempotency-Key": key},
        replayable=True,
    )


def list_rounds(before: int | None, limit: int | None) -> Call[list[models.RoundSummary]]:
    params = {name: value for name, value in (("before", before), ("limit", limit)) if value is not None}
    return Call(
        "GET",
        "/v1/rounds",
        lambda rows: [models.RoundSummary.from_json(row) for row in rows],
        params=params,
        replayable=True,
    )


def get_round(round_id: int) -> Call[dict[str, Any]]:
    return Call("GET", f"/v1/rounds/{int(round_id)}", dict, replayable=True)


def release_lease(lease: int) -> Call[None]:
    return Call("POST", f"/v1/leases/{int(lease)}/release", _nothing, replayable=True)


def cluster() -> Call[list[models.ClusterGpu]]:
    return Call(
        "GET",
        "/v1/cluster",
        lambda view: [models.ClusterGpu.from_json(gpu) for gpu in view["gpus"]],
        replayable=True,
    )


def drain_gpu(gpu: str) -> Call[models.DrainAck]:
    return Call(
        "POST", f"/v1/cluster/gpus/{quote(gpu, safe='')}/drain", models.DrainAck.from_json, replayable=True
    )


def restore_gpu(gpu: str) -> Call[models.DrainAck]:
    return Call(
        "POST", f"/v1/cluster/gpus/{quote(gpu, safe='')}/restore", models.DrainAck.from_json, replayable=True
    )


def events_path(app: int) -> str:
    return f"{_app(app)}/events"


# --- answers ----------------------------------------------------------------------------------


def decode(call: Call[T], status: int, content_type: str, text: str) -> T:
    """The answer's value, or the typed exception for a refusal."""
    body = _json_body(content_type, text)
    if status >= 400:
        raise refusal(status, content_type, text)
    return call.parse(body)


def refusal(status: int, content_type: str, text: str) -> ApiError:
    """The typed exception for an error answer (problem+json or not)."""
    return ApiError.from_problem(status, _json_body(content_type, text), text)


def _json_body(content_type: str, text: str) -> Any:
    if not (text and "json" in content_type):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


# --- retries ----------------------------------------------------------------------------------

RETRYABLE_STATUSES = frozenset({502, 503, 504})
"""The arbiter answers 503 when it or its database is briefly unavailable, and a refused
request changes nothing; 502 and 504 come from a proxy in front of it."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry: `attempts` in all, waiting `base_delay` x 2^n (at most
    `max_delay`, with jitter) between them."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 3.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if not (self.base_delay >= 0 and self.max_delay >= 0):
            raise ValueError("RetryPolicy delays must be >= 0 seconds")

    def delays(self) -> Iterator[float]:
        """The waits before each retry (one fewer than `attempts`)."""
        for attempt in range(self.attempts - 1):
            delay = min(self.max_delay, self.base_delay * 2**attempt)
            yield delay * random.uniform(0.5, 1.0)


def may_retry_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES


def leader_of(status: int, text: str) -> str | None:
    """The leader a standby arbiter names in its 503 `not_leader` answer, where the request
    goes next (several arbiters sharing a database: docs/deploy.md, "High availability")."""
    if status != 503:
        return None
    try:
        problem = json.loads(text)
    except ValueError:
        return None
    if not isinstance(problem, dict) or problem.get("code") != "not_leader":
        return None
    leader = problem.get("leader")
    return leader if isinstance(leader, str) else None


def may_retry_failure(call: Call[Any], sent: bool) -> bool:
    """A transport failure is retried when the request never left (`sent` False) or is safe to
    send again."""
    return not sent or call.replayable


def gave_up(call: Call[Any], error: Exception) -> TransportError:
    return TransportError(f"{call.method} {call.path}: the arbiter did not answer after retries: {error}")


# --- server-sent events -----------------------------------------------------------------------


class SseParser:
    """Turns the lines of a `text/event-stream` into events (WHATWG rules: `id:`, `event:`,
    `data:` fields, a blank line dispatches, lines starting with `:` are comments)."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._kind = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> models.Event | None:
        """The event a line completes, if any."""
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> models.Event | None:
        data, kind, event_id = self._data, self._kind, self._id
        self._data, self._kind = [], "message"
        if not data or event_id is None:
            return None
        return models.Event.parse(int(event_id), kind, json.loads("\n".join(data)))
