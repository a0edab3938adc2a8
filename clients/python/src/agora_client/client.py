"""The synchronous client (httpx)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx

from . import _api, models
from ._api import Call, RetryPolicy
from .leases import LeaseGrants

T = TypeVar("T")

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class Client:
    """A tenant's (or the admin's) connection to an Agora arbiter.

    >>> with Client("http://127.0.0.1:8080", token) as agora:
    ...     app = agora.register_app(models.RegisterApp(name="sweep", app=spec))

    Every refusal raises a subclass of `agora_client.ApiError` carrying the arbiter's code and
    message. Requests the arbiter could not take (503, a dropped connection) are retried per
    `retry`; bids are sent with one Idempotency-Key for all their attempts. A standby arbiter's
    503 `not_leader` names the leader, and the client then sends to the leader instead.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retry: RetryPolicy | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not token:
            raise ValueError("token is empty: pass a tenant token (or the admin token)")
        self.retry = retry or RetryPolicy()
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call[T]) -> T:
        """Sends `call`, retrying what may be retried, and returns its parsed answer."""
        delays = self.retry.delays()
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, json=call.body, params=call.params, headers=call.headers
                )
            except httpx.TransportError as error:
                sent = not isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
                delay = next(delays, None) if _api.may_retry_failure(call, sent) else None
                if delay is None:
                    raise _api.gave_up(call, error) from error
                time.sleep(delay)
                continue
            if _api.may_retry_status(response.status_code):
                leader = _api.leader_of(response.status_code, response.text)
                if leader is not None:
                    # A standby: this and later requests go to the leader it names.
                    self._http.base_url = leader
                delay = next(delays, None)
                if delay is not None:
                    time.sleep(delay)
                    continue
            return _api.decode(
                call, response.status_code, response.headers.get("content-type", ""), response.text
            )

    # --- tenants and apps ---------------------------------------------------------------------

    def create_tenant(self, name: str) -> models.Tenant:
        """Admin only: a new tenant and its first token."""
        return self.send(_api.create_tenant(name))

    def register_app(self, request: models.RegisterApp) -> models.App:
        """Registers a search of the calling tenant; refused whole (nothing stored) if invalid."""
        return self.send(_api.register_app(request))

    def list_apps(self) -> list[models.App]:
        return self.send(_api.list_apps())

    def get_app(self, app: int) -> models.App:
        return self.send(_api.get_app(app))

    def report_progress(self, app: int, jobs: list[models.JobProgress]) -> models.ProgressAck:
        """Iterations done, jobs stopped early, observed iteration times: applied all or nothing."""
        return self.send(_api.report_progress(app, jobs))

    def report_throughput(self, app: int, gpu_type: str, speed: float) -> models.ThroughputAck:
        """The app's measured speed on one GPU type (relative to its iteration times); replaces
        that type's entry of its throughput table."""
        return self.send(_api.report_throughput(app, gpu_type, speed))

    def report_speed_change(
        self, app: int, job: str, at_iteration: int, serial_iteration_time: float
    ) -> models.SpeedChangeAck:
        """The job's speed changes (its batch size was scaled): from `at_iteration` on, an
        iteration takes `serial_iteration_time` seconds on one GPU. Replaces the job's schedule
        from that iteration on."""
        return self.send(_api.report_speed_change(app, job, at_iteration, serial_iteration_time))

    def finish_app(self, app: int) -> None:
        """Ends the app: its leases are released and it stops bidding."""
        self.send(_api.finish_app(app))

    def leases(self, app: int) -> list[models.Lease]:
        """The app's leases, newest first, with their concrete GPUs."""
        return self.send(_api.app_leases(app))

    def why(self, app: int) -> dict[str, Any]:
        """Why the app has what it has (its rho, position, last round), in numbers and words."""
        return self.send(_api.why(app))

    # --- events -------------------------------------------------------------------------------

    def poll_events(
        self, app: int, after: int = 0, timeout_ms: int = 25_000
    ) -> tuple[list[models.Event], int]:
        """One long poll: the events after `after` (waiting up to `timeout_ms` for one) and the
        id to pass as `after` next."""
        return self.send(_api.poll_events(app, after, timeout_ms))

    def events(
        self, app: int, after: int = 0, *, transport: str = "sse", poll_timeout_ms: int = 25_000
    ) -> Iterator[models.Event]:
        """The app's events after `after`, in order, forever (stop iterating to stop). With
        `transport="sse"` they come over Server-Sent Events, reconnecting with `Last-Event-ID`
        when the stream drops; with `"poll"`, by long polls. Nothing is missed either way."""
        if transport == "poll":
            return self._polled_events(app, after, poll_timeout_ms)
        if transport == "sse":
            return self._streamed_events(app, after)
        raise ValueError(f"transport must be 'sse' or 'poll', got {transport!r}")

    def _polled_events(self, app: int, after: int, timeout_ms: int) -> Iterator[models.Event]:
        while True:
            events, after = self.poll_events(app, after, timeout_ms)
            yield from events

    def _streamed_events(self, app: int, after: int) -> Iterator[models.Event]:
        delays = self.retry.delays()
        while True:
            try:
                headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
                with self._http.stream(
                    "GET", _api.events_path(app), headers=headers, timeout=httpx.Timeout(None, connect=5.0)
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _api.refusal(
                            response.status_code, response.headers.get("content-type", ""), response.text
                        )
                    parser = _api.SseParser()
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            after = event.id
                            delays = self.retry.delays()
                            yield event
            except httpx.TransportError as error:
                delay = next(delays, None)
                if delay is None:
                    raise _api.gave_up(Call("GET", _api.events_path(app), dict), error) from error
                time.sleep(delay)

    def lease_grants(self, app: int, *, after: int = 0, poll_timeout_ms: int = 25_000) -> LeaseGrants:
        """A context manager over the app's lease grants: iterate it for `Lease`s as they are
        granted; on exit every lease it yielded that is still active is released."""
        return LeaseGrants(self, app, after=after, poll_timeout_ms=poll_timeout_ms)

    # --- market -------------------------------------------------------------------------------

    def submit_bid(
        self, round_id: int, bid: models.Bid, *, idempotency_key: str | None = None
    ) -> models.BidAck:
        """An explicit bid for an offer. Every attempt carries the same Idempotency-Key (one is
        made up if none is given), so a retry never stores a second bid."""
        return self.send(_api.submit_bid(round_id, bid, idempotency_key))

    def rounds(self, *, before: int | None = None, limit: int | None = None) -> list[models.RoundSummary]:
        return self.send(_api.list_rounds(before, limit))

    def round(self, round_id: int) -> dict[str, Any]:
        return self.send(_api.get_round(round_id))

    def release_lease(self, lease: int) -> None:
        """Gives a lease back early; its GPUs go to the next round."""
        self.send(_api.release_lease(lease))

    def cluster(self) -> list[models.ClusterGpu]:
        return self.send(_api.cluster())

    def drain_gpu(self, gpu: str) -> models.DrainAck:
        """Admin only: takes a GPU out of service; its lease gets notice and is revoked."""
        return self.send(_api.drain_gpu(gpu))

    def restore_gpu(self, gpu: str) -> models.DrainAck:
        """Admin only: puts a drained GPU back into service."""
        return self.send(_api.restore_gpu(gpu))
