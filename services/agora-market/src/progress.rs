//! Progress reports from an app's HPO framework: iterations done, jobs stopped early, observed
//! iteration times, and speed changes as they happen. They update the app so that its rho and
//! bids follow what really happens.

use serde::{Deserialize, Serialize};

use crate::app::{App, AppKind, Job, SpeedChange, MIN_ITERATION_SECONDS};
use crate::shown::Shown;
use crate::topology::Locality;

/// One job's progress, as a framework reports it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobProgress {
    pub job: String,
    /// Iterations done so far (never fewer than reported before).
    pub completed_iterations: u64,
    /// The framework stopped the job early (successive halving, a poor learning curve).
    #[serde(default)]
    pub stopped: bool,
    #[serde(default)]
    pub observed: Option<ObservedIterations>,
}

/// A measured iteration time: `seconds_per_iteration` on `gpus` GPUs placed at `locality`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedIterations {
    pub locality: Locality,
    pub gpus: u32,
    pub seconds_per_iteration: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProgressError {
    #[error("the app has no job {0:?}; report only jobs it registered")]
    UnknownJob(String),
    #[error("job {job:?}: completed_iterations went back from {before} to {after}")]
    IterationsWentBack {
        job: String,
        before: u64,
        after: u64,
    },
    #[error("job {job:?}: completed_iterations {after} exceeds the job's total of {total}")]
    TooManyIterations { job: String, after: u64, total: u64 },
    #[error("job {job:?}: an observation needs gpus > 0 and a finite seconds_per_iteration > 0")]
    InvalidObservation { job: String },
}

/// A job's speed changed, or is about to (its framework scaled the batch size): from iteration
/// `at_iteration` on, an iteration of `job` takes `serial_iteration_time` seconds on one GPU, in
/// the unit of the job's declared `speed_changes` (iterations of its first batch size).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!(
    {"job": "trial-0", "at_iteration": 1200, "serial_iteration_time": 0.4})))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedChangeReport {
    pub job: String,
    pub at_iteration: u64,
    pub serial_iteration_time: f64,
}

/// A speed change the job cannot take; each message names the report's field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpeedChangeError {
    #[error("job: the app has no job {0:?}; report only jobs it registered")]
    UnknownJob(String),
    #[error("job: {0:?} was stopped; only a running job changes speed")]
    StoppedJob(String),
    #[error(
        "at_iteration: job {job:?} can change speed at iteration {earliest} at the earliest \
         (the iterations it reported done ran at their speed, and iteration 0 runs at its \
         serial_iteration_time), got {at}"
    )]
    BeforeProgress { job: String, at: u64, earliest: u64 },
    #[error("at_iteration must be below job {job:?}'s total_iterations ({total}), got {at}")]
    BeyondTotal { job: String, at: u64, total: u64 },
    #[error(
        "serial_iteration_time must be a finite number of seconds >= {min}, got {}",
        Shown(*seconds),
        min = MIN_ITERATION_SECONDS
    )]
    InvalidTime { seconds: f64 },
}

impl Job {
    /// Records a change reported as it happens. It is a measurement, and it replaces the
    /// forecast from its iteration on: every change declared (or reported before) at or after
    /// `at_iteration` is dropped, the earlier ones stay, and the job runs at the reported speed
    /// until a later report says otherwise. The change may lie ahead of the job's reported
    /// progress (then rho counts its restart pause), never behind it.
    pub fn report_speed_change(&mut self, change: SpeedChange) -> Result<(), SpeedChangeError> {
        let job = || self.id.clone();
        if self.stopped {
            return Err(SpeedChangeError::StoppedJob(job()));
        }
        let earliest = self.completed_iterations.max(1);
        if change.at_iteration < earliest {
            return Err(SpeedChangeError::BeforeProgress {
                job: job(),
                at: change.at_iteration,
                earliest,
            });
        }
        if change.at_iteration >= self.total_iterations {
            return Err(SpeedChangeError::BeyondTotal {
                job: job(),
                at: change.at_iteration,
                total: self.total_iterations,
            });
        }
        let seconds = change.serial_iteration_time;
        if !(seconds.is_finite() && seconds >= MIN_ITERATION_SECONDS) {
            return Err(SpeedChangeError::InvalidTime { seconds });
        }
        self.speed_changes
            .retain(|declared| declared.at_iteration < change.at_iteration);
        self.speed_changes.push(change);
        Ok(())
    }
}

impl App {
    /// Records `report` on its job ([`Job::report_speed_change`]); the app is unchanged if it
    /// is refused. Returns the job after it.
    pub fn report_speed_change(
        &mut self,
        report: &SpeedChangeReport,
    ) -> Result<&Job, SpeedChangeError> {
        let job = self
            .job_mut(&report.job)
            .ok_or_else(|| SpeedChangeError::UnknownJob(report.job.clone()))?;
        job.report_speed_change(SpeedChange {
            at_iteration: report.at_iteration,
            serial_iteration_time: report.serial_iteration_time,
        })?;
        Ok(job)
    }
}

impl App {
    /// Applies `reports` all or nothing. Returns the placement slowdown each observation implied
    /// (iteration time = serial time x slowdown / GPUs), in report order.
    pub fn apply_progress(&mut self, reports: &[JobProgress]) -> Result<Vec<f64>, ProgressError> {
        let mut updated = self.clone();
        let mut slowdowns = Vec::new();
        for report in reports {
            let job = updated
                .job_mut(&report.job)
                .ok_or_else(|| ProgressError::UnknownJob(report.job.clone()))?;
            slowdowns.extend(apply_to_job(job, report)?);
        }
        updated.advance_finished_phases();
        *self = updated;
        Ok(slowdowns)
    }

    /// Whether the app already took `reports`: they are valid and move no job's progress, as
    /// when a report is sent again after its answer was lost. The measurements they carry are
    /// not compared; the app took them the first time.
    pub fn already_took(&self, reports: &[JobProgress]) -> bool {
        let progress = |app: &App| -> Vec<(u64, bool)> {
            app.jobs()
                .into_iter()
                .map(|job| (job.completed_iterations, job.stopped))
                .collect()
        };
        let mut after = self.clone();
        after.apply_progress(reports).is_ok() && progress(&after) == progress(self)
    }

    fn job_mut(&mut self, id: &str) -> Option<&mut Job> {
        match &mut self.kind {
            AppKind::SingleJob { job, .. } => (job.id == id).then_some(job),
            AppKind::SuccessiveHalving(search) => search.jobs.iter_mut().find(|job| job.id == id),
            AppKind::PerformanceCurve(search) => search
                .jobs
                .iter_mut()
                .map(|curve| &mut curve.job)
                .find(|job| job.id == id),
        }
    }

    /// A successive-halving phase ends when none of its jobs is still running: the framework
    /// has stopped the losers, and the survivors go on to the next phase. Asynchronous
    /// frameworks (ASHA, Optuna's pruners) let survivors run past later phases' ends before the
    /// last loser stops, so one report may end several phases.
    fn advance_finished_phases(&mut self) {
        while self.running_jobs().is_empty() {
            let AppKind::SuccessiveHalving(search) = &mut self.kind else {
                return;
            };
            if search.current_phase + 1 >= search.phase_iterations.len() {
                return;
            }
            let survivors: Vec<String> = search
                .jobs
                .iter()
                .filter(|job| !job.stopped)
                .map(|job| job.id.clone())
                .collect();
            let survivors: Vec<&str> = survivors.iter().map(String::as_str).collect();
            search.advance_phase(&survivors);
        }
    }
}

fn apply_to_job(job: &mut Job, report: &JobProgress) -> Result<Option<f64>, ProgressError> {
    let after = report.completed_iterations;
    if after < job.completed_iterations {
        return Err(ProgressError::IterationsWentBack {
            job: job.id.clone(),
            before: job.completed_iterations,
            after,
        });
    }
    if after > job.total_iterations {
        return Err(ProgressError::TooManyIterations {
            job: job.id.clone(),
            after,
            total: job.total_iterations,
        });
    }
    job.completed_iterations = after;
    job.stopped |= report.stopped;
    let Some(observed) = report.observed else {
        return Ok(None);
    };
    let valid = observed.gpus > 0
        && observed.seconds_per_iteration.is_finite()
        && observed.seconds_per_iteration > 0.0;
    if !valid {
        return Err(ProgressError::InvalidObservation {
            job: job.id.clone(),
        });
    }
    let serial = job.serial_iteration_time_at(job.completed_iterations as f64);
    let slowdown = observed.seconds_per_iteration * f64::from(observed.gpus) / serial;
    job.slowdown.observe(observed.locality, slowdown);
    Ok(Some(slowdown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{AppId, PlacementSlowdown, SuccessiveHalving};

    fn job(id: &str, total: u64) -> Job {
        Job {
            id: id.to_owned(),
            total_iterations: total,
            completed_iterations: 0,
            serial_iteration_time: 2.0,
            max_gpus: 2,
            slowdown: PlacementSlowdown::default(),
            stopped: false,
            speed_changes: Vec::new(),
        }
    }

    fn report(job: &str, completed: u64) -> JobProgress {
        JobProgress {
            job: job.to_owned(),
            completed_iterations: completed,
            stopped: false,
            observed: None,
        }
    }

    fn measured(
        job: &str,
        completed: u64,
        locality: Locality,
        gpus: u32,
        seconds: f64,
    ) -> JobProgress {
        JobProgress {
            observed: Some(ObservedIterations {
                locality,
                gpus,
                seconds_per_iteration: seconds,
            }),
            ..report(job, completed)
        }
    }

    fn single(total: u64) -> App {
        App {
            id: AppId::from("a"),
            kind: AppKind::SingleJob {
                job: job("j", total),
                throughput: Default::default(),
                sensitivity: Default::default(),
            },
        }
    }

    #[test]
    fn iterations_advance_and_finish_the_app() {
        let mut app = single(100);
        app.apply_progress(&[report("j", 40)]).expect("valid");
        assert!((app.remaining_work_gpu_seconds() - 120.0).abs() < 1e-9);
        app.apply_progress(&[report("j", 100)]).expect("valid");
        assert!(app.is_finished());
    }

    #[test]
    fn an_observation_sets_the_slowdown_of_its_locality() {
        let mut app = single(100);
        let observed = measured("j", 10, Locality::CrossRack, 2, 1.5);
        let slowdowns = app.apply_progress(&[observed]).expect("valid");
        assert_eq!(slowdowns, vec![1.5]);
        let AppKind::SingleJob { job, .. } = &app.kind else {
            unreachable!("built as a single job")
        };
        assert_eq!(job.slowdown.at(Locality::CrossRack), 1.5);
    }

    #[test]
    fn bad_reports_change_nothing() {
        let mut app = single(100);
        app.apply_progress(&[report("j", 50)]).expect("valid");
        let before = app.clone();
        for bad in [
            vec![report("j", 60), report("nope", 1)],
            vec![report("j", 49)],
            vec![report("j", 101)],
            vec![measured("j", 60, Locality::SameSlot, 0, 1.0)],
        ] {
            assert!(app.apply_progress(&bad).is_err());
            assert_eq!(app, before);
        }
    }

    #[test]
    fn a_report_sent_again_was_already_taken_and_any_other_was_not() {
        let mut app = single(100);
        let last = measured("j", 100, Locality::SameSlot, 2, 1.0);
        assert!(!app.already_took(std::slice::from_ref(&last)));
        app.apply_progress(std::slice::from_ref(&last))
            .expect("valid");
        assert!(app.is_finished());
        assert!(app.already_took(std::slice::from_ref(&last)));
        assert!(
            app.already_took(&[report("j", 100)]),
            "without the measurement"
        );
        let stopped = JobProgress {
            stopped: true,
            ..report("j", 100)
        };
        for other in [
            vec![stopped],
            vec![report("j", 99)],
            vec![report("j", 101)],
            vec![report("j", 100), report("nope", 1)],
        ] {
            assert!(!app.already_took(&other), "{other:?}");
        }
    }

    #[test]
    fn successive_halving_moves_on_once_the_losers_are_stopped() {
        let mut app = App {
            id: AppId::from("sh"),
            kind: AppKind::SuccessiveHalving(SuccessiveHalving {
                budget_gpu_seconds: 1_000.0,
                phase_iterations: vec![10, 20],
                jobs_per_phase: vec![2, 1],
                max_gpus_per_phase: Vec::new(),
                current_phase: 0,
                jobs: vec![job("a", 30), job("b", 30)],
                throughput: Default::default(),
                sensitivity: Default::default(),
            }),
        };
        app.apply_progress(&[report("a", 10)]).expect("valid");
        let AppKind::SuccessiveHalving(search) = &app.kind else {
            unreachable!()
        };
        assert_eq!(search.current_phase, 0, "b is still running phase 0");
        let stop_b = JobProgress {
            stopped: true,
            ..report("b", 10)
        };
        app.apply_progress(&[stop_b]).expect("valid");
        let AppKind::SuccessiveHalving(search) = &app.kind else {
            unreachable!()
        };
        assert_eq!(search.current_phase, 1);
        assert_eq!(app.current_demand(), 2, "only a runs in phase 1");
    }

    #[test]
    fn a_report_ends_every_phase_the_survivors_already_ran_past() {
        // Asynchronous successive halving: a runs past the ends of phases 0 and 1 (at 1 and 3)
        // before b is stopped at the first. Phase 2 (to 9) is where a still runs.
        let mut app = App {
            id: AppId::from("asha"),
            kind: AppKind::SuccessiveHalving(SuccessiveHalving {
                budget_gpu_seconds: 1_000.0,
                phase_iterations: vec![1, 2, 6],
                jobs_per_phase: vec![2, 1, 1],
                max_gpus_per_phase: Vec::new(),
                current_phase: 0,
                jobs: vec![job("a", 9), job("b", 9)],
                throughput: Default::default(),
                sensitivity: Default::default(),
            }),
        };
        app.apply_progress(&[report("a", 5)]).expect("valid");
        let stop_b = JobProgress {
            stopped: true,
            ..report("b", 1)
        };
        app.apply_progress(&[stop_b]).expect("valid");
        let AppKind::SuccessiveHalving(search) = &app.kind else {
            unreachable!()
        };
        assert_eq!(search.current_phase, 2);
        assert_eq!(app.current_demand(), 2, "a still runs, to iteration 9");
        assert!(!app.is_finished());
    }
}
