"""The asynchronous client (httpx, asyncio): the same calls as `Client`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx

from . import _api, models
from ._api import Call, RetryPolicy
from .client import DEFAULT_TIMEOUT
from .errors import Conflict

T = TypeVar("T")


class AsyncClient:
    """`Client` for asyncio: `async with AsyncClient(url, token) as agora: await agora.cluster()`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retry: RetryPolicy | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not token:
            raise ValueError("token is empty: pass a tenant token (or the admin token)")
        self.retry = retry or RetryPolicy()
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        """Sends `call`, retrying what may be retried, and returns its parsed answer."""
        delays = self.retry.delays()
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.body, params=call.params, headers=call.headers
                )
            except httpx.TransportError as error:
                sent = not isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
                delay = next(delays, None) if _api.may_retry_failure(call, sent) else None
                if delay is None:
                    raise _api.gave_up(call, error) from error
                await asyncio.sleep(delay)
                continue
            if _api.may_retry_status(response.status_code):
                leader = _api.leader_of(response.status_code, response.text)
                if leader is not None:
                    # A standby: this and later requests go to the leader it names.
                    self._http.base_url = leader
                delay = next(delays, None)
                if delay is not None:
                    await asyncio.sleep(delay)
                    continue
            return _api.decode(
                call, response.status_code, response.headers.get("content-type", ""), response.text
            )

    async def create_tenant(self, name: str) -> models.Tenant:
        return await self.send(_api.create_tenant(name))

    async def register_app(self, request: models.RegisterApp) -> models.App:
        return await self.send(_api.register_app(request))

    async def list_apps(self) -> list[models.App]:
        return await self.send(_api.list_apps())

    async def get_app(self, app: int) -> models.App:
        return await self.send(_api.get_app(app))

    async def report_progress(self, app: int, jobs: list[models.JobProgress]) -> models.ProgressAck:
        return await self.send(_api.report_progress(app, jobs))

    async def report_throughput(self, app: int, gpu_type: str, speed: float) -> models.ThroughputAck:
        return await self.send(_api.report_throughput(app, gpu_type, speed))

    async def report_speed_change(
        self, app: int, job: str, at_iteration: int, serial_iteration_time: float
    ) -> models.SpeedChangeAck:
        return await self.send(_api.report_speed_change(app, job, at_iteration, serial_iteration_time))

    async def finish_app(self, app: int) -> None:
        await self.send(_api.finish_app(app))

    async def leases(self, app: int) -> list[models.Lease]:
        return await self.send(_api.app_leases(app))

    async def why(self, app: int) -> dict[str, Any]:
        return await self.send(_api.why(app))

    async def poll_events(
        self, app: int, after: int = 0, timeout_ms: int = 25_000
    ) -> tuple[list[models.Event], int]:
        return await self.send(_api.poll_events(app, after, timeout_ms))

    async def events(
        self, app: int, after: int = 0, *, poll_timeout_ms: int = 25_000
    ) -> AsyncIterator[models.Event]:
        """The app's events after `after`, in order, by long polls, forever."""
        while True:
            events, after = await self.poll_events(app, after, poll_timeout_ms)
            for event in events:
                yield event

    def lease_grants(self, app: int, *, after: int = 0, poll_timeout_ms: int = 25_000) -> AsyncLeaseGrants:
        """`Client.lease_grants` for asyncio: `async with` it, `async for` the leases."""
        return AsyncLeaseGrants(self, app, after=after, poll_timeout_ms=poll_timeout_ms)

    async def submit_bid(
        self, round_id: int, bid: models.Bid, *, idempotency_key: str | None = None
    ) -> models.BidAck:
        return await self.send(_api.submit_bid(round_id, bid, idempotency_key))

    async def rounds(
        self, *, before: int | None = None, limit: int | None = None
    ) -> list[models.RoundSummary]:
        return await self.send(_api.list_rounds(before, limit))

    async def round(self, round_id: int) -> dict[str, Any]:
        return await self.send(_api.get_round(round_id))

    async def release_lease(self, lease: int) -> None:
        await self.send(_api.release_lease(lease))

    async def cluster(self) -> list[models.ClusterGpu]:
        return await self.send(_api.cluster())

    async def drain_gpu(self, gpu: str) -> models.DrainAck:
        return await self.send(_api.drain_gpu(gpu))

    async def restore_gpu(self, gpu: str) -> models.DrainAck:
        return await self.send(_api.restore_gpu(gpu))


class AsyncLeaseGrants:
    """`LeaseGrants` for asyncio: on exit, every lease it yielded that is still active is
    released."""

    def __init__(self, client: AsyncClient, app: int, *, after: int, poll_timeout_ms: int) -> None:
        self._client = client
        self._app = app
        self._after = after
        self._poll_timeout_ms = poll_timeout_ms
        self.granted: list[models.Lease] = []

    async def __aenter__(self) -> AsyncLeaseGrants:
        return self

    async def __aexit__(self, *_: object) -> None:
        active = {lease.id for lease in await self._client.leases(self._app) if lease.state == "active"}
        for lease in self.granted:
            if lease.id in active:
                try:
                    await self._client.release_lease(lease.id)
                except Conflict:
                    pass  # It ended meanwhile: nothing to give back.

    async def __aiter__(self) -> AsyncIterator[models.Lease]:
        async for event in self._client.events(self._app, self._after, poll_timeout_ms=self._poll_timeout_ms):
            self._after = event.id
            if isinstance(event.data, models.LeaseGranted):
                leases = {lease.id: lease for lease in await self._client.leases(self._app)}
                lease = leases[event.data.lease]
                self.granted.append(lease)
                yield lease
