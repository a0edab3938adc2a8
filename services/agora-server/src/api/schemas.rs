//! OpenAPI schemas of the engine's wire types (the engine has no OpenAPI dependency): each
//! mirrors the serde shape of the type it names, so that clients can generate code for them.
//! `tests/api_docs.rs` checks the mirrors against real values of the engine's types.
#![allow(dead_code)] // Schema-only types: read by utoipa's derive, never constructed.

use utoipa::ToSchema;

/// Multiplicative slowdown (>= 1) of a job's iterations for each locality of its GPUs.
#[derive(Debug, ToSchema)]
#[schema(as = PlacementSlowdown)]
pub struct PlacementSlowdownSchema {
    pub same_slot: f64,
    pub same_machine: f64,
    pub same_rack: f64,
    pub cross_rack: f64,
}

/// One training job of an app.
#[derive(Debug, ToSchema)]
#[schema(as = Job)]
pub struct JobSchema {
    /// Unique within the app.
    pub id: String,
    #[schema(minimum = 1)]
    pub total_iterations: u64,
    #[serde(default)]
    pub completed_iterations: u64,
    /// Seconds per iteration on one GPU (at least 1e-6).
    pub serial_iteration_time: f64,
    #[schema(minimum = 1)]
    pub max_gpus: u32,
    /// Estimated until progress reports observe it.
    #[serde(default)]
    pub slowdown: Option<PlacementSlowdownSchema>,
    #[serde(default)]
    pub stopped: bool,
}

/// A job of a performance-curve search, with its predicted stopping point.
#[derive(Debug, ToSchema)]
#[schema(as = CurveJob)]
pub struct CurveJobSchema {
    pub job: JobSchema,
    /// The iteration at which the job is predicted to stop (pessimistic end of the error bar).
    pub predicted_final_iteration: u64,
}

/// The search an app runs (`docs/simulator-inputs.md`).
#[derive(Debug, ToSchema)]
#[schema(as = AppKind)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AppKindSchema {
    /// One job.
    SingleJob { job: JobSchema },
    /// Phase p runs `jobs_per_phase[p]` jobs (never more than the phase before) for
    /// `phase_iterations[p]` more iterations each.
    SuccessiveHalving {
        budget_gpu_seconds: f64,
        phase_iterations: Vec<u64>,
        jobs_per_phase: Vec<u32>,
        #[serde(default)]
        max_gpus_per_phase: Vec<u32>,
        #[serde(default)]
        current_phase: u32,
        jobs: Vec<JobSchema>,
    },
    /// Jobs stopped at their predicted final iteration.
    PerformanceCurve { jobs: Vec<CurveJobSchema> },
}

/// Where a job's GPUs were when an iteration time was measured.
#[derive(Debug, ToSchema)]
#[schema(as = Locality)]
#[serde(rename_all = "snake_case")]
pub enum LocalitySchema {
    SameSlot,
    SameMachine,
    SameRack,
    CrossRack,
}

/// A measured iteration time: `seconds_per_iteration` on `gpus` GPUs placed at `locality`.
#[derive(Debug, ToSchema)]
#[schema(as = ObservedIterations)]
pub struct ObservedIterationsSchema {
    pub locality: LocalitySchema,
    #[schema(minimum = 1)]
    pub gpus: u32,
    pub seconds_per_iteration: f64,
}

/// Progress of one job.
#[derive(Debug, ToSchema)]
#[schema(as = JobProgress)]
pub struct JobProgressSchema {
    pub job: String,
    /// Iterations done so far (never fewer than reported before).
    pub completed_iterations: u64,
    /// The framework stopped the job early.
    #[serde(default)]
    pub stopped: bool,
    #[serde(default)]
    pub observed: Option<ObservedIterationsSchema>,
}

/// Where a GPU is: rack, machine, slot (GPUs of one slot share NVLink or a PCIe switch).
#[derive(Debug, ToSchema)]
#[schema(as = GpuLocation)]
pub struct GpuLocationSchema {
    pub rack: u32,
    pub machine: u32,
    pub slot: u32,
}

/// An offered GPU.
#[derive(Debug, ToSchema)]
#[schema(as = OfferedGpu)]
pub struct OfferedGpuSchema {
    pub id: String,
    pub location: GpuLocationSchema,
}

/// `offer`: the app may bid for `gpus` in `round` until `deadline`.
#[derive(Debug, ToSchema)]
#[schema(as = OfferEvent)]
pub struct OfferEventSchema {
    pub round: i64,
    pub deadline: chrono::DateTime<chrono::Utc>,
    /// The app's standing rho; `null` while it holds and claims no GPU.
    pub rho: Option<f64>,
    pub unmet_demand: i32,
    pub gpus: Vec<OfferedGpuSchema>,
}

/// `round_result`: what the app got in a round it bid in or received leftovers from.
#[derive(Debug, ToSchema)]
#[schema(as = RoundResultEvent)]
pub struct RoundResultEventSchema {
    pub round: i64,
    pub pf_entry: Option<i32>,
    pub c: Option<f64>,
    pub kept_gpus: Vec<String>,
    pub leftover_gpus: Vec<String>,
}

/// `lease_granted`.
#[derive(Debug, ToSchema)]
#[schema(as = LeaseGrantedEvent)]
pub struct LeaseGrantedEventSchema {
    pub lease: i64,
    pub round: i64,
    pub gpus: Vec<String>,
    pub start: chrono::DateTime<chrono::Utc>,
    pub end: chrono::DateTime<chrono::Utc>,
}

/// `lease_ended`: expired, released or revoked.
#[derive(Debug, ToSchema)]
#[schema(as = LeaseEndedEvent)]
pub struct LeaseEndedEventSchema {
    pub lease: i64,
    pub state: String,
    pub gpus: Vec<String>,
    pub reason: Option<String>,
}

/// `revocation_notice`: the lease is revoked at `revoke_at` (checkpoint before).
#[derive(Debug, ToSchema)]
#[schema(as = RevocationNoticeEvent)]
pub struct RevocationNoticeEventSchema {
    pub lease: i64,
    pub gpu: String,
    pub revoke_at: chrono::DateTime<chrono::Utc>,
    pub reason: String,
}

/// An event's payload; the event's `kind` names which.
#[derive(Debug, ToSchema)]
#[schema(as = EventPayload)]
#[serde(untagged)]
pub enum EventPayloadSchema {
    Offer(OfferEventSchema),
    RoundResult(RoundResultEventSchema),
    LeaseGranted(LeaseGrantedEventSchema),
    LeaseEnded(LeaseEndedEventSchema),
    RevocationNotice(RevocationNoticeEventSchema),
}
