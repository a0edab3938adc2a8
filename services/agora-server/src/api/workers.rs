//! GPU hosts: `agora worker` registers its host and heartbeats, with the worker token. The wire
//! types are `agora_protocol`'s, shared with the worker.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{post, web, FromRequest, HttpRequest, HttpResponse};
use agora_protocol::{Heartbeat, HeartbeatReply, HostRegistration, Registered};

use super::body::Body;
use super::problem::{ApiError, ErrorCode, Problem};
use super::{bearer_sha256, ApiState};
use crate::actors::hosts::{HostHeartbeat, RegisterHost};

/// A caller that presented the worker token.
#[derive(Debug, Clone, Copy)]
pub struct WorkerCaller;

impl FromRequest for WorkerCaller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let expected = request
            .app_data::<web::Data<ApiState>>()
            .and_then(|state| state.worker_token_sha256);
        let presented = bearer_sha256(request);
        let verdict = match (expected, presented) {
            (None, _) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::WorkersDisabled,
                "this arbiter takes no GPU hosts: start it with gpus = \"workers\" and a worker_token",
            )),
            (Some(expected), Some(presented)) if expected == presented => Ok(Self),
            _ => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "send `Authorization: Bearer <worker token>` (the arbiter's worker_token, AGORA_WORKER_TOKEN)",
            )),
        };
        Box::pin(std::future::ready(verdict))
    }
}

/// Register a GPU host, or register it again after a restart or an outage (worker token). The
/// cluster grows by the host's new GPUs; the host is up and its healthy GPUs are offered.
#[utoipa::path(post, path = "/v1/workers",
    request_body(content = HostRegistration, example = json!({
        "host": "gpu-node-07",
        "rack": "rack-a",
        "worker_version": "0.1.0",
        "gpus": [
            {"uuid": "GPU-5d0b6c2e-0f7a-4d7e-9a51-3c1f0e2b7a10", "name": "NVIDIA H100 80GB HBM3",
             "memory_total_bytes": 85899345920u64, "pci_bus_id": "00000000:1B:00.0", "index": 0, "slot": 0},
            {"uuid": "GPU-8e4a1f93-6b2c-4c1d-8f0e-2a7b9c3d4e51", "name": "NVIDIA H100 80GB HBM3",
             "memory_total_bytes": 85899345920u64, "pci_bus_id": "00000000:1C:00.0", "index": 1, "slot": 0}
        ],
        "links": [{"a": "GPU-5d0b6c2e-0f7a-4d7e-9a51-3c1f0e2b7a10",
                   "b": "GPU-8e4a1f93-6b2c-4c1d-8f0e-2a7b9c3d4e51", "kind": "nvlink", "nvlinks": 18}]
    })),
    responses((status = 200, body = Registered), (status = 401, body = Problem),
              (status = 403, body = Problem, description = "the arbiter runs a simulated fleet"),
              (status = 422, body = Problem)))]
#[post("/v1/workers")]
pub async fn register(
    state: web::Data<ApiState>,
    _worker: WorkerCaller,
    body: Body<HostRegistration>,
) -> Result<HttpResponse, ApiError> {
    let registration = body.into_inner();
    check_registration(&registration)
        .map_err(|reason| ApiError::unprocessable(ErrorCode::InvalidRegistration, reason))?;
    let registered = state
        .arbiter()
        .await?
        .send(RegisterHost { registration })
        .await??;
    Ok(HttpResponse::Ok().json(registered))
}

/// A host's heartbeat (worker token): each GPU's health and metrics, launched commands that
/// exited, foreign processes seen. The answer lists the leases the host must enforce. An
/// unknown host gets 404 `unknown_host`: register again.
#[utoipa::path(post, path = "/v1/workers/{host}/heartbeat", params(("host" = String, Path)),
    request_body(content = Heartbeat, example = json!({
        "sequence": 42,
        "gpus": [
            {"uuid": "GPU-5d0b6c2e-0f7a-4d7e-9a51-3c1f0e2b7a10", "health": {"status": "healthy"},
             "metrics": {"DCGM_FI_DEV_GPU_UTIL": 97, "DCGM_FI_DEV_FB_USED": 61440,
                         "DCGM_FI_DEV_GPU_TEMP": 64, "DCGM_FI_DEV_POWER_USAGE": 612.5,
                         "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
                         "DCGM_FI_DEV_XID_ERRORS": null}},
            {"uuid": "GPU-8e4a1f93-6b2c-4c1d-8f0e-2a7b9c3d4e51",
             "health": {"status": "unhealthy", "reason": "XID 79: GPU has fallen off the bus"},
             "metrics": {"DCGM_FI_DEV_XID_ERRORS": 79}}
        ],
        "exits": [{"lease_id": 12, "code": null, "signal": 9, "killed_after_grace": true}],
        "violations": []
    })),
    responses((status = 200, body = HeartbeatReply), (status = 401, body = Problem),
              (status = 403, body = Problem, description = "the arbiter runs a simulated fleet"),
              (status = 404, body = Problem, description = "`unknown_host`: register again"),
              (status = 422, body = Problem)))]
#[post("/v1/workers/{host}/heartbeat")]
pub async fn heartbeat(
    state: web::Data<ApiState>,
    _worker: WorkerCaller,
    host: web::Path<String>,
    body: Body<Heartbeat>,
) -> Result<HttpResponse, ApiError> {
    let reply = state
        .arbiter()
        .await?
        .send(HostHeartbeat {
            host: host.into_inner(),
            heartbeat: body.into_inner(),
        })
        .await??;
    Ok(HttpResponse::Ok().json(reply))
}

/// What the engine cannot check: names usable in a URL path, unique GPUs, links between the
/// host's own GPUs.
fn check_registration(registration: &HostRegistration) -> Result<(), String> {
    let name_ok = |name: &str| {
        !name.is_empty()
            && name.len() <= 200
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    if !name_ok(&registration.host) {
        return Err("host must be 1 to 200 letters, digits, '.', '-' or '_'".to_owned());
    }
    if registration.rack.trim().is_empty() || registration.rack.len() > 200 {
        return Err("rack must be 1 to 200 characters".to_owned());
    }
    if registration.gpus.is_empty() {
        return Err("a host registers at least one GPU".to_owned());
    }
    let mut uuids = BTreeSet::new();
    let mut indices = BTreeSet::new();
    for gpu in &registration.gpus {
        if gpu.uuid.is_empty() || gpu.uuid.len() > 200 || gpu.uuid.contains(char::is_whitespace) {
            return Err(format!("GPU uuid {:?} is not a CUDA UUID", gpu.uuid));
        }
        if !uuids.insert(gpu.uuid.as_str()) {
            return Err(format!("GPU {} is listed twice", gpu.uuid));
        }
        if !indices.insert(gpu.index) {
            return Err(format!("NVML index {} is listed twice", gpu.index));
        }
    }
    for link in &registration.links {
        if link.a == link.b || !uuids.contains(link.a.as_str()) || !uuids.contains(link.b.as_str())
        {
            return Err(format!(
                "link {} - {} must join two different GPUs of this host",
                link.a, link.b
            ));
        }
    }
    Ok(())
}
