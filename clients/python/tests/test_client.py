"""The client against a real arbiter: typed answers, typed refusals, retries, events, leases."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agora_client import (
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    NotFound,
    RetryPolicy,
    TransportError,
    Unauthorized,
    Unprocessable,
    _api,
    models,
)

from conftest import Server

SERVER_SETTINGS = {"round_deadline_ms": 1_500}


def sweep(name: str, jobs: int = 2, *, bidding: str = "agent") -> models.RegisterApp:
    spec = models.PerformanceCurve(
        [models.CurveJob(models.Job(f"trial-{index}", 1_000, 0.5), 1_000) for index in range(jobs)]
    )
    return models.RegisterApp(name=name, app=spec, bidding=bidding)  # type: ignore[arg-type]


def first(events, kind: str) -> models.Event:
    return next(event for event in events if event.kind == kind)


def test_every_app_kind_registers_and_reads_back_typed(tenant: Client) -> None:
    specs: list[models.AppSpec] = [
        models.SingleJob(
            models.Job("train", 100, 0.1, max_gpus=2, slowdown=models.PlacementSlowdown(1.0, 1.1, 1.3, 1.6))
        ),
        models.SuccessiveHalving(
            40.0,
            [10, 30],
            [4, 2],
            [models.Job(f"trial-{i}", 40, 0.2) for i in range(4)],
            max_gpus_per_phase=[1, 2],
        ),
        models.PerformanceCurve([models.CurveJob(models.Job("trial-0", 50, 0.3), 30)]),
    ]
    for spec in specs:
        app = tenant.register_app(models.RegisterApp(name=f"kind-{spec.TAG['kind']}", app=spec))
        assert app.kind == spec.TAG["kind"]
        assert app.bidding == "agent" and app.finished_at is None
        assert tenant.get_app(app.id) == app
    assert sorted(app.name for app in tenant.list_apps()) == [
        "kind-performance_curve",
        "kind-single_job",
        "kind-successive_halving",
    ]


def test_a_wrong_token_raises_unauthorized_with_the_servers_message(server: Server) -> None:
    with server.client("not-a-token") as stranger:
        with pytest.raises(Unauthorized) as raised:
            stranger.list_apps()
    assert raised.value.status == 401 and raised.value.code == "unauthorized"
    assert "Bearer" in raised.value.detail


def test_an_unknown_app_raises_not_found(tenant: Client) -> None:
    with pytest.raises(NotFound) as raised:
        tenant.report_progress(987_654, [models.JobProgress("trial-0", 1)])
    assert raised.value.code == "not_found" and "987654" in raised.value.detail


def test_an_invalid_app_is_refused_whole(tenant: Client) -> None:
    bad = models.SuccessiveHalving(10.0, [5, 5], [2], [models.Job("trial-0", 10, 0.1)])
    with pytest.raises(Unprocessable) as raised:
        tenant.register_app(models.RegisterApp(name="lopsided", app=bad))
    assert raised.value.code == "invalid_app"
    assert "phase_iterations" in raised.value.detail
    assert tenant.list_apps() == []


def test_malformed_progress_raises_and_changes_nothing(server: Server, tenant: Client) -> None:
    app = tenant.register_app(sweep("progress"))
    tenant.report_progress(app.id, [models.JobProgress("trial-0", 10)])
    reports = [models.JobProgress("trial-1", 20), models.JobProgress("no-such-trial", 5)]
    with pytest.raises(Unprocessable) as raised:
        tenant.report_progress(app.id, reports)
    assert raised.value.code == "invalid_progress" and "no-such-trial" in raised.value.detail
    with pytest.raises(Unprocessable, match="went back"):
        tenant.report_progress(app.id, [models.JobProgress("trial-0", 3)])
    # Not even the right shape: a negative count is JSON, but not a body the server takes.
    with pytest.raises(Unprocessable) as malformed:
        tenant.report_progress(app.id, [models.JobProgress("trial-1", -1)])
    assert malformed.value.code == "invalid_body" and "`-1`, expected u64" in malformed.value.detail
    rows = server.query(f"SELECT name, completed_iterations FROM jobs WHERE app_id = {app.id} ORDER BY name")
    assert rows == [
        {"name": "trial-0", "completed_iterations": 10},
        {"name": "trial-1", "completed_iterations": 0},
    ]


def test_throughput_reports_update_the_table_of_the_hosts_gpu_type(server: Server, tenant: Client) -> None:
    # The hosts' NVML name, "NVIDIA A100-SXM4-80GB", is GPU type a100.
    assert {(gpu.gpu_type, gpu.product_name, gpu.compute_capability) for gpu in tenant.cluster()} == {
        ("a100", "NVIDIA A100-SXM4-80GB", "8.0")
    }
    app = tenant.register_app(sweep("measured"))
    assert tenant.report_throughput(app.id, "a100", 1.5).throughput == {"a100": 1.5}
    with pytest.raises(Unprocessable) as raised:
        tenant.report_throughput(app.id, "k80", 2.0)
    assert raised.value.code == "invalid_throughput" and "gpu_type" in raised.value.detail
    with pytest.raises(Unprocessable, match="speed"):
        tenant.report_throughput(app.id, "a100", 0.0)
    rows = server.query(f"SELECT gpu_type, speed FROM throughput_reports WHERE app_id = {app.id}")
    assert rows == [{"gpu_type": "a100", "speed": 1.5}]


def test_a_speed_change_replaces_the_schedule_from_its_iteration_and_shows_as_the_phase(
    server: Server, tenant: Client
) -> None:
    declared = [models.SpeedChange(500, 0.3), models.SpeedChange(800, 0.2)]
    job = models.Job("trial-0", 1_000, 0.5, speed_changes=declared)
    app = tenant.register_app(models.RegisterApp(name="adaptive", app=models.SingleJob(job)))
    assert app.jobs == (models.JobPhase("trial-0", 0, 0, 3, 0.5, models.SpeedChange(500, 0.3)),)
    tenant.report_progress(app.id, [models.JobProgress("trial-0", 400)])
    # It scaled its batch size at 400, earlier than declared: the changes from 400 on are dropped.
    ack = tenant.report_speed_change(app.id, "trial-0", 400, 0.25)
    assert ack.speed_changes == (models.SpeedChange(400, 0.25),)
    assert ack.phase == models.JobPhase("trial-0", 400, 1, 2, 0.25, None)
    assert tenant.get_app(app.id).jobs == (ack.phase,)
    with pytest.raises(Unprocessable) as raised:
        tenant.report_speed_change(app.id, "trial-0", 399, 0.2)
    assert raised.value.code == "invalid_speed_change" and "at_iteration" in raised.value.detail
    with pytest.raises(Unprocessable, match="serial_iteration_time"):
        tenant.report_speed_change(app.id, "trial-0", 600, 0.0)
    rows = server.query(
        f"SELECT job, at_iteration, serial_iteration_time FROM speed_change_reports WHERE app_id = {app.id}"
    )
    assert rows == [{"job": "trial-0", "at_iteration": 400, "serial_iteration_time": 0.25}]


def test_a_finished_app_stays_finished_and_refuses_new_progress_with_a_conflict(tenant: Client) -> None:
    app = tenant.register_app(sweep("finished"))
    tenant.finish_app(app.id)
    finished_at = tenant.get_app(app.id).finished_at
    assert finished_at is not None
    tenant.finish_app(app.id)
    assert tenant.get_app(app.id).finished_at == finished_at
    with pytest.raises(Conflict) as raised:
        tenant.report_progress(app.id, [models.JobProgress("trial-0", 1)])
    assert raised.value.code == "app_not_active"


class LoseFirstAnswers(httpx.BaseTransport):
    """Forwards every request to the real arbiter, but loses the answers to the first `n`
    requests matching `path` (as a dropped connection would), and remembers the headers sent."""

    def __init__(self, n: int, path: str) -> None:
        self.inner = httpx.HTTPTransport()
        self.to_lose = n
        self.path = path
        self.sent: list[httpx.Headers] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == self.path:
            self.sent.append(request.headers)
            if self.to_lose > 0:
                self.to_lose -= 1
                response.close()
                raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response


def wait_for_offer(client: Client, app: int) -> models.Event:
    return first(client.events(app, transport="poll", poll_timeout_ms=5_000), "offer")


def test_a_bid_whose_answer_is_lost_is_retried_with_the_same_key_and_stored_once(
    server: Server, tenant: Client, tenant_token: str
) -> None:
    app = tenant.register_app(sweep("explicit", bidding="explicit"))
    offer = wait_for_offer(tenant, app.id)
    gpus = [gpu["id"] for gpu in offer.data["gpus"]]
    path = f"/v1/rounds/{offer.data['round']}/bids"
    lossy = LoseFirstAnswers(2, path)
    with Client(
        server.url, tenant_token, transport=lossy, retry=RetryPolicy(attempts=4, base_delay=0.01)
    ) as client:
        bid = models.Bid(app=app.id, rho_old=None, bids=[models.BidEntry(gpus[:1], 1.5)])
        ack = client.submit_bid(offer.data["round"], bid)
    assert ack.replayed and ack.round == offer.data["round"]
    keys = {headers["idempotency-key"] for headers in lossy.sent}
    assert len(lossy.sent) == 3 and len(keys) == 1
    stored = server.query(
        f"SELECT id, idempotency_key FROM bids WHERE app_id = {app.id} AND source = 'framework'"
    )
    assert stored == [{"id": ack.bid_id, "idempotency_key": keys.pop()}]


def test_a_report_that_finished_the_app_and_lost_its_answer_is_retried_to_the_same_answer(
    server: Server, tenant: Client, tenant_token: str
) -> None:
    app = tenant.register_app(sweep("finish-retry", jobs=1))
    lossy = LoseFirstAnswers(1, f"/v1/apps/{app.id}/progress")
    with Client(server.url, tenant_token, transport=lossy, retry=RetryPolicy(base_delay=0.0)) as client:
        assert client.report_progress(app.id, [models.JobProgress("trial-0", 1_000)]).finished
        client.finish_app(app.id)
    assert len(lossy.sent) == 2
    assert tenant.get_app(app.id).finished_at is not None
    stored = server.query(f"SELECT completed_iterations FROM job_progress WHERE app_id = {app.id}")
    assert stored == [{"completed_iterations": 1_000}]


def test_an_unreachable_arbiter_raises_a_transport_error_after_the_retries() -> None:
    with Client("http://127.0.0.1:9", "token", retry=RetryPolicy(attempts=2, base_delay=0.0)) as client:
        with pytest.raises(TransportError, match="did not answer"):
            client.list_apps()


def test_a_read_that_loses_its_answer_is_retried(server: Server, tenant: Client, tenant_token: str) -> None:
    app = tenant.register_app(sweep("read-retry"))
    lossy = LoseFirstAnswers(1, f"/v1/apps/{app.id}")
    with Client(server.url, tenant_token, transport=lossy, retry=RetryPolicy(base_delay=0.0)) as client:
        assert client.get_app(app.id) == app
    assert len(lossy.sent) == 2


@pytest.mark.parametrize("transport", ["sse", "poll"])
def test_events_carry_the_lease_grant_with_its_gpus(tenant: Client, transport: str) -> None:
    app = tenant.register_app(sweep(f"events-{transport}", jobs=1))
    events = tenant.events(app.id, transport=transport)
    granted = first(events, "lease_granted")
    assert isinstance(granted.data, models.LeaseGranted)
    lease = next(lease for lease in tenant.leases(app.id) if lease.id == granted.data.lease)
    assert tuple(gpu.id for gpu in lease.gpus) == granted.data.gpus
    assert lease.state == "active" and lease.end_at == granted.data.end
    assert lease.cuda_visible_devices.split(",") == [gpu.cuda_uuid for gpu in lease.gpus]
    # Resuming after an event id replays exactly what followed it.
    assert next(tenant.events(app.id, after=granted.id - 1, transport=transport)).id == granted.id
    tenant.finish_app(app.id)


def test_lease_grants_release_the_leases_they_handed_out_on_exit(server: Server, tenant: Client) -> None:
    app = tenant.register_app(sweep("held", jobs=1))
    with tenant.lease_grants(app.id, poll_timeout_ms=5_000) as grants:
        lease = next(iter(grants))
        assert lease.state == "active"
    assert [row["state"] for row in server.query(f"SELECT state FROM leases WHERE id = {lease.id}")] == [
        "released"
    ]
    tenant.finish_app(app.id)


def test_the_async_client_registers_follows_events_and_releases_leases(
    server: Server, tenant_token: str
) -> None:
    token = tenant_token

    async def scenario() -> tuple[models.App, models.Lease]:
        async with AsyncClient(server.url, token) as agora:
            app = await agora.register_app(sweep("async", jobs=1))
            assert await agora.get_app(app.id) == app
            with pytest.raises(Unprocessable):
                await agora.report_progress(app.id, [models.JobProgress("ghost", 1)])
            ack = await agora.report_speed_change(app.id, "trial-0", 100, 0.4)
            assert ack.speed_changes == (models.SpeedChange(100, 0.4),)
            assert (ack.phase.phase, ack.phase.next_change) == (0, models.SpeedChange(100, 0.4))
            async with agora.lease_grants(app.id, poll_timeout_ms=5_000) as grants:
                lease = await anext(aiter(grants))
            await agora.finish_app(app.id)
            return app, lease

    app, lease = asyncio.run(scenario())
    assert server.query(f"SELECT state FROM leases WHERE id = {lease.id}") == [{"state": "released"}]
    assert lease.app_id == app.id


def test_every_refusal_is_an_api_error_carrying_status_code_and_detail(tenant: Client) -> None:
    with pytest.raises(ApiError) as raised:
        tenant.round(10**12)
    assert isinstance(raised.value, NotFound)
    assert (raised.value.status, raised.value.code) == (404, "not_found")
    assert "1000000000000" in raised.value.detail
    assert str(raised.value) == f"404 not_found: {raised.value.detail}"


def test_the_retry_policy_waits_between_attempts_within_its_bounds() -> None:
    delays = list(RetryPolicy(attempts=4, base_delay=0.5, max_delay=1.0).delays())
    assert len(delays) == 3
    assert 0.25 <= delays[0] <= 0.5 and all(0 < delay <= 1.0 for delay in delays)
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_the_sse_parser_follows_the_event_stream_format() -> None:
    parser = _api.SseParser()
    lines = [
        ": keep-alive",
        "id: 41",
        "event: lease_ended",
        'data: {"lease": 7, "state": "revoked",',
        'data: "gpus": ["m0-g0"], "reason": "drained"}',
        "",
        "",
        "id: 42",
        "event: offer",
        'data: {"round": 3}',
        "",
    ]
    events = [event for event in map(parser.feed, lines) if event is not None]
    assert [(event.id, event.kind) for event in events] == [(41, "lease_ended"), (42, "offer")]
    assert events[0].data == models.LeaseEnded(lease=7, state="revoked", gpus=("m0-g0",), reason="drained")
    assert events[1].data == {"round": 3}


def test_a_standby_sends_the_client_to_the_leader_it_names() -> None:
    sent: list[str] = []

    def arbiters(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        if request.url.host == "standby":
            problem = {
                "type": "/problems/not_leader",
                "title": "Service Unavailable",
                "status": 503,
                "detail": "this arbiter is a standby; send the request to the leader at http://leader:8080",
                "code": "not_leader",
                "leader": "http://leader:8080",
            }
            return httpx.Response(503, headers={"Retry-After": "1"}, json=problem)
        return httpx.Response(200, json=[])

    transport = httpx.MockTransport(arbiters)
    with Client(
        "http://standby:8080", "token", transport=transport, retry=RetryPolicy(attempts=2, base_delay=0)
    ) as agora:
        assert agora.list_apps() == []
        assert agora.list_apps() == []
    assert sent == ["http://standby:8080/v1/apps", "http://leader:8080/v1/apps", "http://leader:8080/v1/apps"]
