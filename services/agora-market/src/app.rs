//! Apps (one tenant's hyper-parameter search) and their jobs, with the agent API of Themis
//! Figure 7 as traits so HPO integrations can describe their own searches.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::resources::Sensitivity;
use crate::shown::Shown;
use crate::throughput::Throughput;
use crate::topology::Locality;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AppId(pub String);

impl fmt::Display for AppId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for AppId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

/// Multiplicative slowdown S >= 1 of a job's iterations for each locality level of its GPUs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlacementSlowdown {
    pub same_slot: f64,
    pub same_machine: f64,
    pub same_rack: f64,
    pub cross_rack: f64,
}

impl Default for PlacementSlowdown {
    /// The crude estimates of Themis footnote 3, used until the app reports observed values.
    fn default() -> Self {
        Self {
            same_slot: 1.0,
            same_machine: 1.0,
            same_rack: 1.1,
            cross_rack: 1.3,
        }
    }
}

impl PlacementSlowdown {
    /// No placement sensitivity at all (S = 1 everywhere).
    pub const NONE: Self = Self {
        same_slot: 1.0,
        same_machine: 1.0,
        same_rack: 1.0,
        cross_rack: 1.0,
    };

    pub fn at(&self, locality: Locality) -> f64 {
        match locality {
            Locality::SameSlot => self.same_slot,
            Locality::SameMachine => self.same_machine,
            Locality::SameRack => self.same_rack,
            Locality::CrossRack => self.cross_rack,
        }
    }

    /// Replaces the estimate for one level by an observed value (slowdowns below 1 are
    /// measurement noise and are clamped to 1).
    pub fn observe(&mut self, locality: Locality, slowdown: f64) {
        let value = slowdown.max(1.0);
        match locality {
            Locality::SameSlot => self.same_slot = value,
            Locality::SameMachine => self.same_machine = value,
            Locality::SameRack => self.same_rack = value,
            Locality::CrossRack => self.cross_rack = value,
        }
    }
}

/// What the agent needs to know about one job to estimate its finish time (Figure 7's
/// `JobInfo`, with the job's GPU demand added).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    pub iterations_remaining: f64,
    /// Seconds per iteration on one GPU (the mean over the remaining iterations of a job whose
    /// speed changes).
    pub serial_iteration_time: f64,
    /// The most GPUs the job can use (job_demand_max).
    pub max_gpus: u32,
    pub slowdown: PlacementSlowdown,
    /// Speed changes ahead within the remaining iterations: each pauses the job to checkpoint
    /// and restart with its new batch size.
    #[serde(default)]
    pub speed_changes_ahead: u32,
}

/// The shortest serial iteration time a job may declare: a microsecond. Shorter ones are
/// errors in the input, and would make times and rho underflow.
pub const MIN_ITERATION_SECONDS: f64 = 1e-6;

/// One training job of an app.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub id: String,
    pub total_iterations: u64,
    #[serde(default)]
    pub completed_iterations: u64,
    /// Seconds per iteration on one GPU.
    pub serial_iteration_time: f64,
    pub max_gpus: u32,
    #[serde(default)]
    pub slowdown: PlacementSlowdown,
    /// Set when the job was stopped early by its HPO framework.
    #[serde(default)]
    pub stopped: bool,
    /// How the job's speed changes as it trains (dynamic adaptation such as batch-size
    /// scaling, Shockwave NSDI'23), in increasing `at_iteration`; empty: a fixed speed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub speed_changes: Vec<SpeedChange>,
}

/// From iteration `at_iteration` on, an iteration of the job takes `serial_iteration_time`
/// seconds on one GPU. Iterations count the samples of the job's first batch size, so a job
/// that doubles its batch size and runs 1.2x faster per sample shows as iterations 1/1.2 as
/// long, and its iteration count does not change.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedChange {
    pub at_iteration: u64,
    pub serial_iteration_time: f64,
}

impl Job {
    pub fn is_active(&self) -> bool {
        !self.stopped && self.completed_iterations < self.total_iterations
    }

    fn validate(&self) -> Result<(), String> {
        if self.total_iterations == 0 {
            return Err("total_iterations must be at least 1".to_owned());
        }
        if !(self.serial_iteration_time.is_finite()
            && self.serial_iteration_time >= MIN_ITERATION_SECONDS)
        {
            return Err(format!(
                "serial_iteration_time must be a finite number of seconds >= {MIN_ITERATION_SECONDS}, got {}",
                Shown(self.serial_iteration_time)
            ));
        }
        if self.max_gpus == 0 {
            return Err("max_gpus must be at least 1".to_owned());
        }
        let slowdown = self.slowdown;
        let levels = [
            slowdown.same_slot,
            slowdown.same_machine,
            slowdown.same_rack,
            slowdown.cross_rack,
        ];
        if levels.iter().any(|&s| !(s.is_finite() && s >= 1.0)) {
            return Err(format!(
                "slowdowns must be finite and >= 1, got {slowdown:?}"
            ));
        }
        self.validate_speed_changes()
    }

    fn validate_speed_changes(&self) -> Result<(), String> {
        let mut after = 0;
        for (index, change) in self.speed_changes.iter().enumerate() {
            let field = format!("speed_changes[{index}]");
            if change.at_iteration <= after || change.at_iteration >= self.total_iterations {
                return Err(format!(
                    "{field}.at_iteration must be above {after} (the previous change) and below \
                     total_iterations ({}), got {}",
                    self.total_iterations, change.at_iteration
                ));
            }
            let seconds = change.serial_iteration_time;
            if !(seconds.is_finite() && seconds >= MIN_ITERATION_SECONDS) {
                return Err(format!(
                    "{field}.serial_iteration_time must be a finite number of seconds >= \
                     {MIN_ITERATION_SECONDS}, got {}",
                    Shown(seconds)
                ));
            }
            after = change.at_iteration;
        }
        Ok(())
    }

    /// The phase the job is in at `iteration` (completed iterations, fractional in the
    /// simulator): 0 before its first speed change, `i` from the `i`-th on. The next change is
    /// `speed_changes[i]`, if there is one.
    pub fn phase_at(&self, iteration: f64) -> usize {
        self.speed_changes
            .iter()
            .take_while(|change| change.at_iteration as f64 <= iteration)
            .count()
    }

    /// Seconds per iteration on one GPU at `iteration`: the speed of the phase it is in.
    pub fn serial_iteration_time_at(&self, iteration: f64) -> f64 {
        match self.phase_at(iteration) {
            0 => self.serial_iteration_time,
            phase => self.speed_changes[phase - 1].serial_iteration_time,
        }
    }

    /// The first iteration after `iteration` at which the job's speed changes.
    pub fn next_speed_change(&self, iteration: f64) -> Option<u64> {
        self.speed_changes
            .get(self.phase_at(iteration))
            .map(|change| change.at_iteration)
    }

    /// Seconds on one GPU to run iterations `from..to`, each at its phase's speed: the
    /// forecast that rho and bids use, rather than the speed of the phase running now.
    pub fn serial_seconds(&self, from: f64, to: f64) -> f64 {
        if self.speed_changes.is_empty() {
            return (to - from) * self.serial_iteration_time;
        }
        let starts = std::iter::once(0.0).chain(
            self.speed_changes
                .iter()
                .map(|change| change.at_iteration as f64),
        );
        let ends = self
            .speed_changes
            .iter()
            .map(|change| change.at_iteration as f64)
            .chain(std::iter::once(f64::INFINITY));
        let times = std::iter::once(self.serial_iteration_time).chain(
            self.speed_changes
                .iter()
                .map(|change| change.serial_iteration_time),
        );
        starts
            .zip(ends)
            .zip(times)
            .map(|((start, end), time)| (to.min(end) - from.max(start)).max(0.0) * time)
            .sum()
    }

    /// The job from iteration `from` for `iterations` more, at its mean forecast speed over
    /// them (its fixed speed when it has no speed changes).
    fn info(&self, from: f64, iterations: f64, max_gpus: u32) -> JobInfo {
        let serial_iteration_time = if self.speed_changes.is_empty() || iterations <= 0.0 {
            self.serial_iteration_time_at(from)
        } else {
            self.serial_seconds(from, from + iterations) / iterations
        };
        let ahead = self.speed_changes.iter().filter(|change| {
            let at = change.at_iteration as f64;
            at > from && at < from + iterations
        });
        JobInfo {
            iterations_remaining: iterations,
            serial_iteration_time,
            max_gpus,
            slowdown: self.slowdown,
            speed_changes_ahead: u32::try_from(ahead.count()).unwrap_or(u32::MAX),
        }
    }
}

/// Figure 7, successive halving: `getNumPhases` and `getJobsInPhase`. `gpus` is the number of
/// GPUs the app would hold, for frameworks whose plans depend on it.
pub trait SuccessiveHalvingAgent {
    fn num_phases(&self) -> usize;
    /// The phase running now; earlier phases are done.
    fn current_phase(&self) -> usize;
    fn jobs_in_phase(&self, phase: usize, gpus: u32) -> Vec<JobInfo>;
    /// The aggregate work budget B of the search, in GPU-seconds.
    fn budget_gpu_seconds(&self) -> f64;
}

/// Figure 7, performance-curve stopping: `getJobsRemaining`, each job's iterations up to its
/// predicted (pessimistic) stopping point.
pub trait PerformanceCurveAgent {
    fn jobs_remaining(&self, gpus: u32) -> Vec<JobInfo>;
    /// Work of the whole search up to every job's predicted stopping point, in GPU-seconds.
    fn total_work_gpu_seconds(&self) -> f64;
}

/// A successive-halving search (Hyperband, Vizier): phase p runs `jobs_per_phase[p]` jobs for
/// `phase_iterations[p]` more iterations each; the rest are stopped at the phase's end.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuccessiveHalving {
    pub budget_gpu_seconds: f64,
    pub phase_iterations: Vec<u64>,
    pub jobs_per_phase: Vec<u32>,
    /// The most GPUs each job may use in each phase (Figure 8: as the jobs halve, each survivor
    /// may use twice the GPUs, so the search keeps its width). Empty: every job keeps its own
    /// `max_gpus` in every phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub max_gpus_per_phase: Vec<u32>,
    #[serde(default)]
    pub current_phase: usize,
    /// Every job of the search; the ones still running are those of the current phase.
    pub jobs: Vec<Job>,
    /// The search's speed per GPU type (its jobs train one model); empty: the same on all.
    #[serde(default, skip_serializing_if = "Throughput::is_empty")]
    pub throughput: Throughput,
    /// The search's speed by CPUs and memory per GPU; empty: GPU-proportional CPUs and memory.
    #[serde(default, skip_serializing_if = "Sensitivity::is_empty")]
    pub sensitivity: Sensitivity,
}

impl SuccessiveHalving {
    /// Iterations a job has completed when `phase` ends.
    fn iterations_at_end_of(&self, phase: usize) -> u64 {
        self.phase_iterations.iter().take(phase + 1).sum()
    }

    /// The job used to estimate phases whose jobs are not chosen yet (§4.3.3): the median by
    /// serial iteration time (the upper median for an even count, as in the paper's example).
    fn median_job(&self) -> Option<&Job> {
        let mut running: Vec<&Job> = self.jobs.iter().filter(|job| !job.stopped).collect();
        running.sort_by(|a, b| a.serial_iteration_time.total_cmp(&b.serial_iteration_time));
        running.get(running.len() / 2).copied()
    }

    /// The most GPUs `job` may use in `phase`.
    pub fn job_max_gpus(&self, phase: usize, job: &Job) -> u32 {
        self.max_gpus_per_phase
            .get(phase)
            .copied()
            .unwrap_or(job.max_gpus)
    }

    /// Moves to the next phase, stopping every running job not in `survivors`.
    pub fn advance_phase(&mut self, survivors: &[&str]) {
        for job in &mut self.jobs {
            if !survivors.contains(&job.id.as_str()) {
                job.stopped = true;
            }
        }
        self.current_phase += 1;
    }
}

impl SuccessiveHalvingAgent for SuccessiveHalving {
    fn num_phases(&self) -> usize {
        self.phase_iterations.len()
    }

    fn current_phase(&self) -> usize {
        self.current_phase
    }

    fn jobs_in_phase(&self, phase: usize, _gpus: u32) -> Vec<JobInfo> {
        let phase_end = self.iterations_at_end_of(phase);
        if phase == self.current_phase {
            return self
                .jobs
                .iter()
                .filter(|job| !job.stopped && job.completed_iterations < phase_end)
                .map(|job| {
                    let remaining = (phase_end - job.completed_iterations) as f64;
                    let from = job.completed_iterations as f64;
                    job.info(from, remaining, self.job_max_gpus(phase, job))
                })
                .collect();
        }
        let (Some(median), Some(&count), Some(&iterations)) = (
            self.median_job(),
            self.jobs_per_phase.get(phase),
            self.phase_iterations.get(phase),
        ) else {
            return Vec::new();
        };
        let max_gpus = self.job_max_gpus(phase, median);
        let from = phase_end.saturating_sub(iterations) as f64;
        vec![median.info(from, iterations as f64, max_gpus); count as usize]
    }

    fn budget_gpu_seconds(&self) -> f64 {
        self.budget_gpu_seconds
    }
}

/// A search whose HPO framework stops each job at an iteration it predicts from the job's
/// learning curve (Hyperdrive, Vizier).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerformanceCurve {
    pub jobs: Vec<CurveJob>,
    /// The search's speed per GPU type (its jobs train one model); empty: the same on all.
    #[serde(default, skip_serializing_if = "Throughput::is_empty")]
    pub throughput: Throughput,
    /// The search's speed by CPUs and memory per GPU; empty: GPU-proportional CPUs and memory.
    #[serde(default, skip_serializing_if = "Sensitivity::is_empty")]
    pub sensitivity: Sensitivity,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurveJob {
    pub job: Job,
    /// The iteration at which the job is predicted to stop, taking the pessimistic end of the
    /// prediction's error bar (§4.3.2). At most `job.total_iterations`.
    pub predicted_final_iteration: u64,
}

impl CurveJob {
    fn stopping_iteration(&self) -> u64 {
        self.predicted_final_iteration
            .min(self.job.total_iterations)
    }
}

impl PerformanceCurveAgent for PerformanceCurve {
    fn jobs_remaining(&self, _gpus: u32) -> Vec<JobInfo> {
        self.jobs
            .iter()
            .filter(|curve| {
                !curve.job.stopped && curve.job.completed_iterations < curve.stopping_iteration()
            })
            .map(|curve| {
                let job = &curve.job;
                let remaining = curve.stopping_iteration() - job.completed_iterations;
                job.info(
                    job.completed_iterations as f64,
                    remaining as f64,
                    job.max_gpus,
                )
            })
            .collect()
    }

    fn total_work_gpu_seconds(&self) -> f64 {
        self.jobs
            .iter()
            .map(|curve| {
                let stop = curve.stopping_iteration() as f64;
                curve.job.serial_seconds(0.0, stop)
            })
            .sum()
    }
}

/// The three kinds of app the engine estimates finish times for. Written with `kind` beside
/// the kind's own fields; read by [`AppKind::deserialize`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AppKind {
    SingleJob {
        job: Job,
        /// The job's speed per GPU type; empty: the same on all.
        #[serde(default, skip_serializing_if = "Throughput::is_empty")]
        throughput: Throughput,
        /// The job's speed by CPUs and memory per GPU; empty: GPU-proportional shares.
        #[serde(default, skip_serializing_if = "Sensitivity::is_empty")]
        sensitivity: Sensitivity,
    },
    SuccessiveHalving(SuccessiveHalving),
    PerformanceCurve(PerformanceCurve),
}

/// The fields of [`AppKind::SingleJob`], read apart from its tag.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SingleJobFields {
    job: Job,
    #[serde(default)]
    throughput: Throughput,
    #[serde(default)]
    sensitivity: Sensitivity,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum AppKindTag {
    SingleJob,
    SuccessiveHalving,
    PerformanceCurve,
}

/// Reads the object whole, takes `kind` out and reads the rest as that kind's fields, so that
/// an error names the field inside the app (`job.throughput.v100: invalid type: ...`). Serde's
/// derived reading of a tagged enum buffers the object and loses that path.
impl<'de> Deserialize<'de> for AppKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut fields = serde_json::Map::deserialize(deserializer)?;
        let tag = fields
            .remove("kind")
            .ok_or_else(|| D::Error::missing_field("kind"))?;
        let rest = serde_json::Value::Object(fields);
        Ok(match read::<AppKindTag, D::Error>(tag, "kind")? {
            AppKindTag::SingleJob => {
                let fields: SingleJobFields = read(rest, "")?;
                AppKind::SingleJob {
                    job: fields.job,
                    throughput: fields.throughput,
                    sensitivity: fields.sensitivity,
                }
            }
            AppKindTag::SuccessiveHalving => AppKind::SuccessiveHalving(read(rest, "")?),
            AppKindTag::PerformanceCurve => AppKind::PerformanceCurve(read(rest, "")?),
        })
    }
}

/// `value` as a `T`, or an error that starts with the path of the bad value under `at`.
fn read<T: serde::de::DeserializeOwned, E: serde::de::Error>(
    value: serde_json::Value,
    at: &str,
) -> Result<T, E> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let path = match (at, path.as_str()) {
            (at, ".") => at.to_owned(),
            ("", path) => path.to_owned(),
            (at, path) => format!("{at}.{path}"),
        };
        if path.is_empty() {
            E::custom(error.inner())
        } else {
            E::custom(format_args!("{path}: {}", error.inner()))
        }
    })
}

/// `AppKind`'s schema: one object per kind, `kind` beside the kind's own fields, as serde reads
/// it. (A derived schema would put `kind` in an `allOf` beside a schema that refuses unknown
/// fields, which no object satisfies.)
#[cfg(feature = "openapi")]
mod app_kind_schema {
    use std::borrow::Cow;

    use utoipa::openapi::schema::{
        AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type,
    };
    use utoipa::openapi::{Ref, RefOr};
    use utoipa::{PartialSchema, ToSchema};

    use super::{AppKind, Job, PerformanceCurve, Sensitivity, SuccessiveHalving, Throughput};

    fn kind(name: &str) -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([name]))
    }

    /// `T`'s fields with `kind` added.
    fn variant<T: PartialSchema>(name: &str) -> Schema {
        let RefOr::T(Schema::Object(mut object)) = T::schema() else {
            unreachable!("the derived schema of a struct with named fields is an object")
        };
        object
            .properties
            .insert("kind".to_owned(), kind(name).into());
        object.required.insert(0, "kind".to_owned());
        Schema::Object(object)
    }

    impl PartialSchema for AppKind {
        fn schema() -> RefOr<Schema> {
            let single_job = ObjectBuilder::new()
                .description(Some("One training job."))
                .property("kind", kind("single_job"))
                .property("job", Ref::from_schema_name(Job::name()))
                .property("throughput", Throughput::schema())
                .property("sensitivity", Sensitivity::schema())
                .required("kind")
                .required("job")
                .additional_properties(Some(AdditionalProperties::FreeForm(false)));
            OneOfBuilder::new()
                .description(Some(
                    "The search, by `kind`, with its jobs (the engine's app format, \
                     docs/simulator-inputs.md).",
                ))
                .item(single_job)
                .item(variant::<SuccessiveHalving>("successive_halving"))
                .item(variant::<PerformanceCurve>("performance_curve"))
                .into()
        }
    }

    impl ToSchema for AppKind {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("AppKind")
        }

        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((Job::name().into_owned(), Job::schema()));
            <Job as ToSchema>::schemas(schemas);
            <SuccessiveHalving as ToSchema>::schemas(schemas);
            <PerformanceCurve as ToSchema>::schemas(schemas);
        }
    }
}

/// An app: one tenant's search, the unit the market is fair to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct App {
    pub id: AppId,
    #[serde(flatten)]
    pub kind: AppKind,
}

impl App {
    /// Orders apps by what they are, never by their ids or their jobs' ids: the tie-break
    /// between apps that stand equal, so that only identical apps are ever told apart by name.
    pub fn cmp_content(&self, other: &App) -> Ordering {
        let (mine, theirs) = (self.content_key(), other.content_key());
        mine.iter()
            .zip(&theirs)
            .map(|(a, b)| a.total_cmp(b))
            .find(|order| order.is_ne())
            .unwrap_or_else(|| mine.len().cmp(&theirs.len()))
    }

    /// Every number that describes the app, in a fixed order, its kind first.
    fn content_key(&self) -> Vec<f64> {
        fn job(key: &mut Vec<f64>, job: &Job) {
            let slowdown = &job.slowdown;
            key.extend([
                job.total_iterations as f64,
                job.completed_iterations as f64,
                job.serial_iteration_time,
                f64::from(job.max_gpus),
                slowdown.same_slot,
                slowdown.same_machine,
                slowdown.same_rack,
                slowdown.cross_rack,
                f64::from(u8::from(job.stopped)),
            ]);
            // Only a job that changes speed adds numbers: the keys of the others stay as
            // they were.
            if !job.speed_changes.is_empty() {
                key.push(job.speed_changes.len() as f64);
                for change in &job.speed_changes {
                    key.extend([change.at_iteration as f64, change.serial_iteration_time]);
                }
            }
        }
        let mut key = Vec::new();
        match &self.kind {
            AppKind::SingleJob { job: single, .. } => {
                key.push(0.0);
                job(&mut key, single);
            }
            AppKind::SuccessiveHalving(search) => {
                key.extend([1.0, search.budget_gpu_seconds, search.current_phase as f64]);
                for list in [&search.jobs_per_phase, &search.max_gpus_per_phase] {
                    key.push(list.len() as f64);
                    key.extend(list.iter().map(|&value| f64::from(value)));
                }
                key.push(search.phase_iterations.len() as f64);
                key.extend(search.phase_iterations.iter().map(|&value| value as f64));
                search.jobs.iter().for_each(|each| job(&mut key, each));
            }
            AppKind::PerformanceCurve(search) => {
                key.push(2.0);
                for curve in &search.jobs {
                    key.push(curve.predicted_final_iteration as f64);
                    job(&mut key, &curve.job);
                }
            }
        }
        // Speeds in type-name order: what the app is, as its numbers are.
        key.extend(self.throughput().0.values());
        key.extend(self.sensitivity().content_numbers());
        key
    }

    /// The app's speed per GPU type (empty: the same on every type).
    pub fn throughput(&self) -> &Throughput {
        match &self.kind {
            AppKind::SingleJob { throughput, .. } => throughput,
            AppKind::SuccessiveHalving(search) => &search.throughput,
            AppKind::PerformanceCurve(search) => &search.throughput,
        }
    }

    /// The app's speed by CPUs and memory per GPU (empty: GPU-proportional shares).
    pub fn sensitivity(&self) -> &Sensitivity {
        match &self.kind {
            AppKind::SingleJob { sensitivity, .. } => sensitivity,
            AppKind::SuccessiveHalving(search) => &search.sensitivity,
            AppKind::PerformanceCurve(search) => &search.sensitivity,
        }
    }

    /// The app's sensitivity profile, to set it.
    pub fn sensitivity_mut(&mut self) -> &mut Sensitivity {
        match &mut self.kind {
            AppKind::SingleJob { sensitivity, .. } => sensitivity,
            AppKind::SuccessiveHalving(search) => &mut search.sensitivity,
            AppKind::PerformanceCurve(search) => &mut search.sensitivity,
        }
    }

    /// The app's throughput table, to set it.
    pub fn throughput_mut(&mut self) -> &mut Throughput {
        match &mut self.kind {
            AppKind::SingleJob { throughput, .. } => throughput,
            AppKind::SuccessiveHalving(search) => &mut search.throughput,
            AppKind::PerformanceCurve(search) => &mut search.throughput,
        }
    }

    /// Jobs still to run now, with what remains of each (for successive halving: the jobs of
    /// the current phase up to the phase's end).
    pub fn running_jobs(&self) -> Vec<JobInfo> {
        match &self.kind {
            AppKind::SingleJob { job, .. } if job.is_active() => {
                let remaining = job.total_iterations - job.completed_iterations;
                let from = job.completed_iterations as f64;
                vec![job.info(from, remaining as f64, job.max_gpus)]
            }
            AppKind::SingleJob { .. } => Vec::new(),
            AppKind::SuccessiveHalving(search) => search.jobs_in_phase(search.current_phase, 0),
            AppKind::PerformanceCurve(search) => search.jobs_remaining(0),
        }
    }

    /// GPU-seconds of work still to do (no slowdown): the running jobs' remaining iterations and,
    /// for successive halving, the phases still to come.
    pub fn remaining_work_gpu_seconds(&self) -> f64 {
        let work = |jobs: Vec<JobInfo>| -> f64 {
            jobs.iter()
                .map(|job| job.iterations_remaining * job.serial_iteration_time)
                .sum()
        };
        match &self.kind {
            AppKind::SuccessiveHalving(search) => (search.current_phase()..search.num_phases())
                .map(|phase| work(search.jobs_in_phase(phase, 0)))
                .sum(),
            _ => work(self.running_jobs()),
        }
    }

    /// GPU-seconds of work of the whole app (no slowdown): the budget B of a successive-halving
    /// search, every job's work up to its (predicted) end otherwise.
    pub fn total_work_gpu_seconds(&self) -> f64 {
        match &self.kind {
            AppKind::SingleJob { job, .. } => job.serial_seconds(0.0, job.total_iterations as f64),
            AppKind::SuccessiveHalving(search) => search.budget_gpu_seconds(),
            AppKind::PerformanceCurve(search) => search.total_work_gpu_seconds(),
        }
    }

    /// The most GPUs `job` (one of this app's) may use now.
    pub fn job_max_gpus(&self, job: &Job) -> u32 {
        match &self.kind {
            AppKind::SuccessiveHalving(search) => search.job_max_gpus(search.current_phase, job),
            _ => job.max_gpus,
        }
    }

    /// The most GPUs the app can use now: the sum of its running jobs' demands. A
    /// successive-halving search also keeps what its next phase will use, so GPUs freed by jobs
    /// that finished the phase first stay for the survivors instead of leaving and coming back
    /// (each return a restart).
    pub fn current_demand(&self) -> u32 {
        let demand = |jobs: Vec<JobInfo>| jobs.iter().map(|job| job.max_gpus).sum::<u32>();
        let running = demand(self.running_jobs());
        match &self.kind {
            AppKind::SuccessiveHalving(search) if running > 0 => {
                let next = search.current_phase + 1;
                let upcoming = if next < search.num_phases() {
                    demand(search.jobs_in_phase(next, 0))
                } else {
                    0
                };
                running.max(upcoming)
            }
            _ => running,
        }
    }

    /// Every job of the app, stopped and finished ones included.
    pub fn jobs(&self) -> Vec<&Job> {
        match &self.kind {
            AppKind::SingleJob { job, .. } => vec![job],
            AppKind::SuccessiveHalving(search) => search.jobs.iter().collect(),
            AppKind::PerformanceCurve(search) => {
                search.jobs.iter().map(|curve| &curve.job).collect()
            }
        }
    }

    /// Checks what the types cannot: distinct job ids; per job positive iterations and
    /// iteration times, at least one GPU and slowdowns >= 1; a consistent successive-halving
    /// plan; and at least one job left to run.
    pub fn validate(&self) -> Result<(), String> {
        if let AppKind::SuccessiveHalving(search) = &self.kind {
            if search.phase_iterations.is_empty()
                || search.phase_iterations.len() != search.jobs_per_phase.len()
            {
                return Err(
                    "phase_iterations and jobs_per_phase must be non-empty and of equal length"
                        .to_owned(),
                );
            }
            // Each phase keeps the best jobs of the one before: a phase never runs more jobs.
            if let Some(phase) = search
                .jobs_per_phase
                .windows(2)
                .position(|pair| pair[1] > pair[0])
            {
                return Err(format!(
                    "jobs_per_phase must not grow from one phase to the next (successive halving \
                     only stops jobs), but phase {} runs {} jobs after {}",
                    phase + 1,
                    search.jobs_per_phase[phase + 1],
                    search.jobs_per_phase[phase]
                ));
            }
            if !(search.budget_gpu_seconds.is_finite() && search.budget_gpu_seconds > 0.0) {
                return Err("budget_gpu_seconds must be positive".to_owned());
            }
            let caps = &search.max_gpus_per_phase;
            if !caps.is_empty() && caps.len() != search.phase_iterations.len() {
                return Err(format!(
                    "max_gpus_per_phase must have one entry per phase ({}), got {}",
                    search.phase_iterations.len(),
                    caps.len()
                ));
            }
            if caps.contains(&0) {
                return Err("max_gpus_per_phase entries must be at least 1".to_owned());
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for job in self.jobs() {
            if !ids.insert(job.id.as_str()) {
                return Err(format!("job id `{}` appears twice", job.id));
            }
            job.validate()
                .map_err(|reason| format!("job `{}`: {reason}", job.id))?;
        }
        self.throughput().validate()?;
        self.sensitivity().validate()?;
        if self.running_jobs().is_empty() {
            return Err("has no job left to run".to_owned());
        }
        Ok(())
    }

    pub fn is_finished(&self) -> bool {
        match &self.kind {
            AppKind::SuccessiveHalving(search) => {
                let in_last_phase = search.current_phase + 1 >= search.num_phases();
                search.current_phase >= search.num_phases()
                    || (in_last_phase && self.running_jobs().is_empty())
            }
            _ => self.running_jobs().is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bad value inside an app is named by its path in the app, for every kind, with the tag
    /// anywhere in the object; a missing or unknown kind and an unknown field are named too.
    #[test]
    fn a_bad_app_is_refused_naming_the_field_inside_it() {
        let job =
            r#"{"id": "j", "total_iterations": 10, "serial_iteration_time": 1.0, "max_gpus": 1}"#;
        let cases = [
            (
                format!(
                    r#"{{"job": {job}, "throughput": {{"v100": "fast"}}, "kind": "single_job"}}"#
                ),
                "throughput.v100: invalid type: string \"fast\", expected f64",
            ),
            (
                r#"{"kind": "single_job", "job": {"id": "j", "total_iterations": -1}}"#.to_owned(),
                "job.total_iterations: invalid value: integer `-1`",
            ),
            (
                format!(
                    r#"{{"kind": "performance_curve", "jobs": [{{"job": {job}, "predicted_final_iteration": "x"}}]}}"#
                ),
                "jobs[0].predicted_final_iteration: invalid type: string",
            ),
            (
                format!(r#"{{"kind": "successive_halving", "jobs": [{job}], "sensitivity": 3}}"#),
                "sensitivity: invalid type: integer `3`",
            ),
            (format!(r#"{{"job": {job}}}"#), "missing field `kind`"),
            (
                format!(r#"{{"kind": "nope", "job": {job}}}"#),
                "kind: unknown variant `nope`",
            ),
            (
                format!(r#"{{"kind": "single_job", "job": {job}, "extra": 1}}"#),
                "extra: unknown field `extra`",
            ),
        ];
        for (json, expected) in cases {
            let error = serde_json::from_str::<AppKind>(&json)
                .expect_err(&json)
                .to_string();
            assert!(error.starts_with(expected), "{json}: {error}");
        }
        let good =
            format!(r#"{{"job": {job}, "throughput": {{"v100": 2.0}}, "kind": "single_job"}}"#);
        let app: AppKind = serde_json::from_str(&good).expect("valid");
        let written = serde_json::to_value(&app).expect("serialisable");
        assert_eq!(
            serde_json::from_value::<AppKind>(written).expect("reads back"),
            app
        );
    }

    fn job(id: &str, completed: u64, max_gpus: u32) -> Job {
        Job {
            id: id.into(),
            total_iterations: 100,
            completed_iterations: completed,
            serial_iteration_time: 1.0,
            max_gpus,
            slowdown: PlacementSlowdown::default(),
            stopped: false,
            speed_changes: Vec::new(),
        }
    }

    fn halving(current_phase: usize, completed: u64) -> App {
        App {
            id: AppId::from("sh"),
            kind: AppKind::SuccessiveHalving(SuccessiveHalving {
                budget_gpu_seconds: 1000.0,
                phase_iterations: vec![10, 20],
                jobs_per_phase: vec![2, 1],
                max_gpus_per_phase: Vec::new(),
                current_phase,
                jobs: vec![job("a", completed, 2), job("b", completed, 3)],
                throughput: Default::default(),
                sensitivity: Default::default(),
            }),
        }
    }

    #[test]
    fn a_search_whose_phases_grow_is_refused() {
        let mut app = halving(0, 0);
        assert_eq!(app.validate(), Ok(()));
        if let AppKind::SuccessiveHalving(search) = &mut app.kind {
            search.phase_iterations = vec![10, 20, 30];
            search.jobs_per_phase = vec![4, 8, 1];
        }
        let refusal = app.validate().expect_err("growing phases");
        assert!(refusal.contains("jobs_per_phase"), "{refusal}");
    }

    #[test]
    fn demand_is_the_sum_over_running_jobs() {
        assert_eq!(halving(0, 0).current_demand(), 5);
        let single = App {
            id: AppId::from("s"),
            kind: AppKind::SingleJob {
                job: job("j", 100, 4),
                throughput: Throughput::default(),
                sensitivity: Default::default(),
            },
        };
        assert_eq!(single.current_demand(), 0, "a finished job wants nothing");
        assert!(single.is_finished());
    }

    #[test]
    fn successive_halving_finishes_after_its_last_phase() {
        assert!(
            !halving(0, 10).is_finished(),
            "phase 0 done, phase 1 still to run"
        );
        let mut app = halving(0, 10);
        let AppKind::SuccessiveHalving(search) = &mut app.kind else {
            unreachable!()
        };
        search.advance_phase(&["b"]);
        assert_eq!(app.running_jobs().len(), 1);
        assert!(!app.is_finished());
        let AppKind::SuccessiveHalving(search) = &mut app.kind else {
            unreachable!()
        };
        search.jobs[1].completed_iterations = 30;
        assert!(app.is_finished());
    }

    #[test]
    fn performance_curve_jobs_stop_at_their_prediction() {
        let curve = PerformanceCurve {
            jobs: vec![
                CurveJob {
                    job: job("a", 40, 1),
                    predicted_final_iteration: 60,
                },
                CurveJob {
                    job: job("b", 40, 1),
                    predicted_final_iteration: 40,
                },
                CurveJob {
                    job: job("c", 0, 1),
                    predicted_final_iteration: 500,
                },
            ],
            throughput: Default::default(),
            sensitivity: Default::default(),
        };
        let remaining: Vec<f64> = curve
            .jobs_remaining(1)
            .iter()
            .map(|job| job.iterations_remaining)
            .collect();
        assert_eq!(
            remaining,
            vec![20.0, 100.0],
            "b is done; c's prediction is capped at its total"
        );
        assert_eq!(curve.total_work_gpu_seconds(), 60.0 + 40.0 + 100.0);
    }

    #[test]
    fn observed_slowdowns_replace_estimates_and_never_go_below_one() {
        let mut slowdown = PlacementSlowdown::default();
        slowdown.observe(Locality::CrossRack, 2.5);
        slowdown.observe(Locality::SameMachine, 0.9);
        assert_eq!(slowdown.at(Locality::CrossRack), 2.5);
        assert_eq!(slowdown.at(Locality::SameMachine), 1.0);
        assert_eq!(slowdown.at(Locality::SameRack), 1.1);
    }

    #[test]
    fn misspelt_job_fields_are_rejected() {
        let json = r#"{"id": "a", "kind": "single_job", "job": {"id": "j", "total_iterations": 10,
            "serial_iteration_time": 1.0, "max_gpu": 2}}"#;
        let error = serde_json::from_str::<App>(json).expect_err("max_gpu is a typo of max_gpus");
        assert!(error.to_string().contains("max_gpu"), "{error}");
    }

    #[test]
    fn misspelt_app_fields_are_rejected() {
        let json = r#"{"id": "a", "kind": "single_job", "jobs": [], "job": {"id": "j",
            "total_iterations": 10, "serial_iteration_time": 1.0, "max_gpus": 2}}"#;
        let error =
            serde_json::from_str::<App>(json).expect_err("jobs is not a field of a single job");
        assert!(error.to_string().contains("jobs"), "{error}");
    }

    #[test]
    fn app_json_names_its_kind() {
        let app = halving(0, 0);
        let json = serde_json::to_value(&app).expect("serialisable");
        assert_eq!(json["kind"], "successive_halving");
        let back: App = serde_json::from_value(json).expect("round trip");
        assert_eq!(back, app);
    }
}
