//! Finish-time fairness: rho(G) = T_shared(G) / T_independent (Themis §4.3, Equations 1 and 2),
//! assuming the allocation G is held until the app completes.
//!
//! One job model serves every estimate: an app is a sequence of phases, each a set of jobs
//! sharing the app's GPUs ([`job_widths`]); a phase lasts as long as its slowest job, and a job
//! whose GPU count changes between phases pauses to checkpoint and restore. T_sh's remaining
//! time and T_cluster (the app alone on the whole cluster) are both [`PhasePlan::time_on`] of
//! that model, so an app alone on an empty cluster has rho 1.
//!
//! On a cluster of mixed GPU types each job runs at the app's speed on the slowest GPU of its
//! share ([`GpuSpeeds`]), and the app's scheduler places its most critical jobs on its fastest
//! GPUs; with no throughput table every speed is 1 and nothing changes.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Range;

use crate::app::{App, AppKind, JobInfo, PerformanceCurveAgent, SuccessiveHalvingAgent};
use crate::rho::Rho;
use crate::throughput::GpuSpeeds;
use crate::time::Timestamp;
use crate::topology::{container_of, GpuLocation, Locality, SLOT};

/// What the estimate needs besides the app and the GPUs: when it is, when the app arrived, how
/// long the app would take alone on the cluster and how contended the cluster has been.
#[derive(Debug, Clone, PartialEq)]
pub struct FairnessContext {
    pub now: Timestamp,
    pub arrival: Timestamp,
    /// T_cluster: the app's finish time alone on the whole cluster, estimated when it arrived
    /// ([`cluster_time`]).
    pub cluster_seconds: f64,
    /// N_avg: the time-weighted average number of active apps over the app's lifetime so far.
    pub average_contention: f64,
    /// How long a job pauses to checkpoint and restore when its GPU count changes.
    pub restart_pause_seconds: f64,
    /// The app's speed on each GPU of the cluster.
    pub speeds: GpuSpeeds,
}

/// rho of `app` if it holds `gpus` until it completes; `None` when that is never (no GPUs while
/// work remains), the "starving" case.
pub fn rho(app: &App, gpus: &[GpuLocation], context: &FairnessContext) -> Option<Rho> {
    rho_of_plan(&PhasePlan::remaining(app, gpus.len()), gpus, context)
}

/// [`rho`] with the app's remaining phases already priced for `gpus.len()` GPUs: an agent
/// values every candidate bundle of one size against the same plan.
pub fn rho_of_plan(
    plan: &PhasePlan,
    gpus: &[GpuLocation],
    context: &FairnessContext,
) -> Option<Rho> {
    let independent = independent_finish_time(context);
    let shared = shared_finish_time(plan, gpus, context);
    Rho::new(shared / independent).ok()
}

/// T_sh: time already spent plus the time to finish `plan` holding `gpus`.
pub fn shared_finish_time(
    plan: &PhasePlan,
    gpus: &[GpuLocation],
    context: &FairnessContext,
) -> f64 {
    context.now.saturating_since(context.arrival).as_secs_f64()
        + plan.time_on(gpus, &context.speeds, context.restart_pause_seconds)
}

/// T_id = T_cluster * N_avg.
pub fn independent_finish_time(context: &FairnessContext) -> f64 {
    context.cluster_seconds * context.average_contention.max(1.0)
}

/// Seconds until `app` completes if it holds `gpus` (at `speeds`) until then.
pub fn remaining_time(
    app: &App,
    gpus: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> f64 {
    PhasePlan::remaining(app, gpus.len()).time_on(gpus, speeds, restart_pause_seconds)
}

/// T_cluster: seconds `app` takes from now holding every GPU of the cluster (at `cluster`),
/// under the same job model as [`remaining_time`]: each job within its demand, its phases one
/// after another, each job at the slowdown of its own share, resizes paused. Unlike the paper's
/// fluid bound (total work / min(R_C, demand)) it is a time the app can actually achieve.
/// On a mixed cluster the app's jobs take its fastest GPUs first.
pub fn cluster_time(
    app: &App,
    cluster: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> f64 {
    remaining_time(app, cluster, speeds, restart_pause_seconds)
}

/// The phases `app` still has to run, the current one first, as the agent API describes them
/// for an app holding `gpu_count` GPUs.
pub fn remaining_phases(app: &App, gpu_count: u32) -> Vec<Vec<JobInfo>> {
    match &app.kind {
        AppKind::SingleJob { .. } => vec![app.running_jobs()],
        AppKind::SuccessiveHalving(search) => (search.current_phase()..search.num_phases())
            .map(|phase| search.jobs_in_phase(phase, gpu_count))
            .collect(),
        AppKind::PerformanceCurve(search) => vec![search.jobs_remaining(gpu_count)],
    }
}

/// Phases of jobs to run one after another, each with its jobs' work and GPU demands and how
/// the app's scheduler shares `gpu_count` GPUs among them ([`job_widths`]): what pricing a
/// bundle of that many GPUs needs besides the GPUs themselves, computed once for all of them.
#[derive(Debug, Clone)]
pub struct PhasePlan {
    gpu_count: usize,
    phases: Vec<PlannedPhase>,
}

#[derive(Debug, Clone)]
struct PlannedPhase {
    jobs: Vec<JobInfo>,
    work: Vec<f64>,
    demands: Vec<u32>,
    /// The jobs' widths on `gpu_count` GPUs.
    widths: Vec<usize>,
}

impl PhasePlan {
    /// `phases` (empty ones are skipped) priced for `gpu_count` GPUs.
    pub fn new(phases: Vec<Vec<JobInfo>>, gpu_count: usize) -> Self {
        let phases = phases
            .into_iter()
            .filter(|jobs| !jobs.is_empty())
            .map(|jobs| {
                let (work, demands) = (job_work(&jobs), job_demands(&jobs));
                let widths = job_widths(&work, &demands, gpu_count);
                PlannedPhase {
                    jobs,
                    work,
                    demands,
                    widths,
                }
            })
            .collect();
        Self { gpu_count, phases }
    }

    /// The phases `app` still has to run ([`remaining_phases`]), priced for `gpu_count` GPUs.
    pub fn remaining(app: &App, gpu_count: usize) -> Self {
        let count = u32::try_from(gpu_count).unwrap_or(u32::MAX);
        Self::new(remaining_phases(app, count), gpu_count)
    }

    /// Seconds to run the phases one after another on `gpus`: each phase ends with its slowest
    /// job. Between phases a job keeps its width (its GPU count) unless the next phase's share
    /// differs and resizing pays: growing must save more than the restart pause it costs, and
    /// a share narrower than the width forces the resize. A phase runs on the GPUs the earlier
    /// ones used when they are enough (an app keeps the GPUs it started on), else on all of
    /// `gpus`; jobs that resize may move to better-placed GPUs of `gpus`, since they restart
    /// anyway. The GPUs are ordered fastest first (for the app, at `speeds`), then by
    /// topology.
    pub fn time_on(
        &self,
        gpus: &[GpuLocation],
        speeds: &GpuSpeeds,
        restart_pause_seconds: f64,
    ) -> f64 {
        let mut ordered = gpus.to_vec();
        speeds.sort_fastest_first(&mut ordered);
        let mut footprint: Vec<GpuLocation> = Vec::new();
        let mut width = None;
        let mut total = 0.0;
        for planned in &self.phases {
            let phase = Phase {
                jobs: &planned.jobs,
                work: &planned.work,
                demands: &planned.demands,
                known_widths: Some((self.gpu_count, &planned.widths)),
            };
            let on_all = phase.widths(ordered.len());
            let pool: &[GpuLocation] = if on_all.iter().sum::<usize>() <= footprint.len() {
                &footprint
            } else {
                &ordered
            };
            let share = if pool.len() == ordered.len() {
                on_all
            } else {
                phase.widths(pool.len())
            }
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
            let (resized, used) = phase_time(&phase, pool, speeds, restart_pause_seconds);
            // Jobs that resize restart anyway, so they may move: to better-placed GPUs
            // elsewhere when the earlier phases' footprint places them worse.
            let mut pool_len = pool.len();
            let (resized, used) = if pool_len < ordered.len() && width.is_some_and(|w| w != share) {
                let (moved, moved_used) =
                    phase_time(&phase, &ordered, speeds, restart_pause_seconds);
                if moved < resized {
                    pool_len = ordered.len();
                    (moved, moved_used)
                } else {
                    (resized, used)
                }
            } else {
                (resized, used)
            };
            let (time, used) = match width {
                Some(previous) if share > previous => {
                    let capped = capped(phase.demands, previous);
                    let kept_phase = Phase {
                        demands: &capped,
                        known_widths: None,
                        ..phase
                    };
                    let (kept, kept_used) =
                        phase_time(&kept_phase, pool, speeds, restart_pause_seconds);
                    if kept - resized > restart_pause_seconds {
                        width = Some(share);
                        (resized + restart_pause_seconds, used)
                    } else {
                        (kept, kept_used)
                    }
                }
                Some(previous) if share < previous => {
                    width = Some(share);
                    (resized + restart_pause_seconds, used)
                }
                _ => {
                    width = Some(share);
                    (resized, used)
                }
            };
            total += time;
            if pool_len != footprint.len() || footprint.is_empty() {
                footprint = used;
                footprint.sort_unstable();
            }
        }
        total
    }
}

/// The jobs of one phase, with each job's work and GPU demand computed once for every estimate
/// of the phase.
#[derive(Clone, Copy)]
struct Phase<'a> {
    jobs: &'a [JobInfo],
    work: &'a [f64],
    demands: &'a [u32],
    /// The jobs' widths on one number of GPUs, when already known.
    known_widths: Option<(usize, &'a [usize])>,
}

impl Phase<'_> {
    /// The jobs' widths on `gpu_count` GPUs ([`job_widths`]).
    fn widths(&self, gpu_count: usize) -> Cow<'_, [usize]> {
        match self.known_widths {
            Some((count, widths)) if count == gpu_count => Cow::Borrowed(widths),
            _ => Cow::Owned(job_widths(self.work, self.demands, gpu_count)),
        }
    }
}

/// `demands` limited to `width` GPUs each.
fn capped(demands: &[u32], width: usize) -> Vec<u32> {
    let width = u32::try_from(width).unwrap_or(u32::MAX).max(1);
    demands.iter().map(|&demand| demand.min(width)).collect()
}

fn job_work(jobs: &[JobInfo]) -> Vec<f64> {
    jobs.iter()
        .map(|job| job.iterations_remaining * job.serial_iteration_time)
        .collect()
}

fn job_demands(jobs: &[JobInfo]) -> Vec<u32> {
    jobs.iter().map(|job| job.max_gpus).collect()
}

/// How an app's scheduler shares `gpu_count` GPUs among jobs with the given remaining `work`
/// and demands: each job's width (its GPU count), 0 for a job that waits.
///
/// With at least one GPU per job, the GPUs are dealt out one at a time to the jobs below their
/// demand, most work first, round after round: an even split where no job gets more than it
/// can use and what one cannot use goes to the others. With fewer GPUs than jobs, the jobs
/// with the most work run on one GPU each and the others wait.
pub fn job_widths(work: &[f64], max_gpus: &[u32], gpu_count: usize) -> Vec<usize> {
    let mut by_work: Vec<usize> = (0..work.len()).collect();
    by_work.sort_by(|&a, &b| work[b].total_cmp(&work[a]).then(a.cmp(&b)));
    let mut widths = vec![0; work.len()];
    if gpu_count < work.len() {
        for &job in by_work.iter().take(gpu_count) {
            widths[job] = 1;
        }
        return widths;
    }
    let demand = |job: usize| max_gpus[job].max(1) as usize;
    let mut left = gpu_count;
    while left > 0 {
        let before = left;
        for &job in &by_work {
            if left > 0 && widths[job] < demand(job) {
                widths[job] += 1;
                left -= 1;
            }
        }
        if left == before {
            break;
        }
    }
    widths
}

/// Time for the phase's jobs to all finish on `gpus`, and the GPUs they use: on the GPUs of
/// every speed down to [`slowest_useful_speed`] (all of them when the app has one speed on them
/// all).
fn phase_time(
    phase: &Phase,
    gpus: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> (f64, Vec<GpuLocation>) {
    let floor = useful_floor(phase, gpus, speeds, restart_pause_seconds);
    let useful = at_least(gpus, speeds, floor);
    phase_time_on(phase, &useful, speeds, restart_pause_seconds)
}

/// The slowest GPU speed worth using for `jobs` on `gpus`: the app's scheduler leaves a slower
/// type idle when its jobs finish no later without it. A job waits for its slowest GPU and
/// [`job_widths`] shares GPUs by count, so two K80s given to a job that one V100 would run 8x
/// faster slow the whole phase down. Each speed of `gpus` is tried as the floor, fastest
/// first, among the floors that leave a GPU for every job (a GPU is never left idle while a
/// job waits for one); the fastest floor with the shortest phase wins. One speed: that speed
/// (nothing left out, nothing recomputed).
pub fn slowest_useful_speed(
    jobs: &[JobInfo],
    gpus: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> f64 {
    let (work, demands) = (job_work(jobs), job_demands(jobs));
    let phase = Phase {
        jobs,
        work: &work,
        demands: &demands,
        known_widths: None,
    };
    useful_floor(&phase, gpus, speeds, restart_pause_seconds)
}

/// [`slowest_useful_speed`] of a phase whose work and demands are already computed.
fn useful_floor(
    phase: &Phase,
    gpus: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> f64 {
    // One speed, the usual case, is settled without collecting and sorting every GPU's.
    let first = gpus.first().map(|&gpu| speeds.at(gpu));
    if gpus.iter().all(|&gpu| Some(speeds.at(gpu)) == first) {
        return first.unwrap_or(1.0);
    }
    let mut floors: Vec<f64> = gpus.iter().map(|&gpu| speeds.at(gpu)).collect();
    floors.sort_by(|a, b| b.total_cmp(a));
    floors.dedup();
    let slowest = floors[floors.len() - 1];
    let mut best = (f64::INFINITY, slowest);
    for floor in floors {
        let useful = at_least(gpus, speeds, floor);
        let leaves_jobs_waiting = floor > slowest && useful.len() < phase.jobs.len();
        if leaves_jobs_waiting {
            continue;
        }
        let time = phase_time_on(phase, &useful, speeds, restart_pause_seconds).0;
        if time < best.0 {
            best = (time, floor);
        }
    }
    best.1
}

/// The GPUs of `gpus` at `floor` speed or faster, in their order; `gpus` itself when that is
/// all of them (one speed, the usual case), without a copy.
fn at_least<'g>(gpus: &'g [GpuLocation], speeds: &GpuSpeeds, floor: f64) -> Cow<'g, [GpuLocation]> {
    if gpus.iter().all(|&gpu| speeds.at(gpu) >= floor) {
        return Cow::Borrowed(gpus);
    }
    gpus.iter()
        .copied()
        .filter(|&gpu| speeds.at(gpu) >= floor)
        .collect()
}

/// Time for the phase's jobs to all finish on `ordered` (GPUs in topology order; the phase ends
/// when its slowest job does), with the GPUs shared as [`job_widths`] does, and the GPUs the
/// jobs use (in no particular order). With fewer GPUs than jobs the waiting jobs queue for the GPUs: longest job first
/// onto the least-loaded GPU, as the §4.3.3 example schedules them. A job runs at the speed of
/// the slowest GPU of its share, and pauses `restart_pause_seconds` at each speed change ahead.
fn phase_time_on(
    phase: &Phase,
    ordered: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> (f64, Vec<GpuLocation>) {
    let Phase { jobs, work, .. } = *phase;
    let pauses = |job: &JobInfo| f64::from(job.speed_changes_ahead) * restart_pause_seconds;
    if jobs.is_empty() {
        return (0.0, Vec::new());
    }
    if ordered.is_empty() {
        return (f64::INFINITY, Vec::new());
    }
    if ordered.len() < jobs.len() {
        let mut by_work: Vec<usize> = (0..jobs.len()).collect();
        by_work.sort_by(|&a, &b| work[b].total_cmp(&work[a]));
        let mut load = vec![0.0_f64; ordered.len()];
        for job in by_work {
            let (gpu, least) = load
                .iter_mut()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .expect("at least one gpu");
            *least += work[job] * jobs[job].slowdown.at(Locality::SameSlot)
                / speeds.at(ordered[gpu])
                + pauses(&jobs[job]);
        }
        return (load.into_iter().fold(0.0, f64::max), ordered.to_vec());
    }
    let widths = phase.widths(ordered.len());
    // Each job's time is read off its share as it is placed, so no share is kept; the phase's
    // time is their maximum, whatever order the jobs are placed in.
    let mut time = 0.0_f64;
    let mut used = Vec::with_capacity(widths.iter().sum());
    place_each(&widths, work, ordered, speeds, |job, share| {
        if share.is_empty() {
            return;
        }
        let gpus = || share.iter().map(|&item| ordered[item]);
        let (locality, speed) = (Locality::of(gpus()), speeds.slowest(gpus()));
        let job_time = work[job] * jobs[job].slowdown.at(locality) / share.len() as f64 / speed
            + pauses(&jobs[job]);
        time = time.max(job_time);
        used.extend(gpus());
    });
    (time, used)
}

/// How an app's scheduler places jobs of the given widths and remaining work on a pool of
/// GPUs: the job with the most work per GPU first (the one the phase waits for gets the best
/// placement), then the widest (then the order given), each on the best-placed free GPUs (the
/// fastest, then smallest slot, machine or rack that holds it). Returns each job's GPUs as
/// positions in `pool`; a job of width 0 gets none, and a job gets fewer than its width only
/// if the pool runs out.
pub fn place_widths(
    widths: &[usize],
    work: &[f64],
    pool: &[GpuLocation],
    speeds: &GpuSpeeds,
) -> Vec<Vec<usize>> {
    let mut placed = vec![Vec::new(); widths.len()];
    place_each(widths, work, pool, speeds, |job, share| {
        placed[job] = share.to_vec()
    });
    placed
}

/// [`place_widths`], handing each job's share to `visit` as it is placed (in placement order)
/// instead of collecting them: the agents' estimates need only each share's time.
fn place_each(
    widths: &[usize],
    work: &[f64],
    pool: &[GpuLocation],
    speeds: &GpuSpeeds,
    mut visit: impl FnMut(usize, &[usize]),
) {
    let per_gpu = |job: usize| work[job] / widths[job].max(1) as f64;
    PLACEMENT_BUFFERS.with_borrow_mut(|buffers| {
        let PlacementBuffers {
            critical_first,
            share,
            free,
        } = buffers;
        critical_first.clear();
        critical_first.extend(0..widths.len());
        critical_first.sort_by(|&a, &b| {
            per_gpu(b)
                .total_cmp(&per_gpu(a))
                .then(widths[b].cmp(&widths[a]))
                .then(a.cmp(&b))
        });
        let mut free = FreeGpus::new(pool, speeds, free);
        for &job in critical_first.iter() {
            free.take_best_fit(widths[job], share);
            visit(job, share);
        }
    });
}

thread_local! {
    /// Best-fit placement's buffers, kept from one placement to the next on each thread:
    /// agents place an app's jobs for every bundle they price (thousands a round), and
    /// allocation was a third of a bid's time, these buffers its largest part. Nothing is
    /// carried over but capacity: each placement clears them.
    static PLACEMENT_BUFFERS: RefCell<PlacementBuffers> = RefCell::default();
}

/// The buffers of one placement: the order the jobs are placed in, the share being placed and
/// the free GPUs.
#[derive(Default)]
struct PlacementBuffers {
    critical_first: Vec<usize>,
    share: Vec<usize>,
    free: FreeBuffers,
}

/// What best-fit placement builds over a pool: which positions are taken, and each topology
/// level's grouping of them.
#[derive(Default)]
struct FreeBuffers {
    taken: Vec<bool>,
    levels: [Level; 3],
}

/// The free GPUs of a pool, grouped by slot, machine and rack, for best-fit placement.
struct FreeGpus<'a> {
    pool: &'a [GpuLocation],
    speeds: &'a GpuSpeeds,
    taken: &'a mut Vec<bool>,
    levels: &'a mut [Level; 3],
}

/// The containers of one topology level: the pool's positions ordered by container number,
/// then pool order, and each container with its range of that order and how many of its
/// positions are free. Built only when a request first looks at the level (most bundles fit
/// in a slot or a machine), as flat vectors whose free counts follow each take instead of
/// being recounted.
#[derive(Default)]
struct Level {
    built: bool,
    /// Container number and pool position packed in one integer, sorted: a plain integer
    /// sort orders the positions.
    keyed: Vec<u64>,
    order: Vec<usize>,
    containers: Vec<Container>,
    /// The index in `containers` of each pool position's container.
    container_at: Vec<usize>,
}

struct Container {
    number: u32,
    range: Range<usize>,
    free: usize,
}

impl Level {
    fn build(&mut self, pool: &[GpuLocation], level: usize, taken: &[bool]) {
        self.keyed.clear();
        self.keyed
            .extend(pool.iter().enumerate().map(|(position, &location)| {
                u64::from(container_of(location, level)) << 32 | position as u64
            }));
        self.keyed.sort_unstable();
        let position_of = |key: u64| (key & u64::from(u32::MAX)) as usize;
        self.containers.clear();
        self.container_at.clear();
        self.container_at.resize(pool.len(), 0);
        for (index, &key) in self.keyed.iter().enumerate() {
            let (number, position) = ((key >> 32) as u32, position_of(key));
            match self.containers.last_mut() {
                Some(last) if last.number == number => last.range.end = index + 1,
                _ => self.containers.push(Container {
                    number,
                    range: index..index + 1,
                    free: 0,
                }),
            }
            self.container_at[position] = self.containers.len() - 1;
            if !taken[position] {
                self.containers
                    .last_mut()
                    .expect("a container was pushed")
                    .free += 1;
            }
        }
        self.order.clear();
        self.order
            .extend(self.keyed.iter().map(|&key| position_of(key)));
        self.built = true;
    }

    /// Each container's number, its positions in pool order and how many of them are free,
    /// for the containers with at least `count` free.
    fn fitting(&self, count: usize) -> impl Iterator<Item = (u32, &[usize], usize)> {
        self.containers
            .iter()
            .filter(move |container| container.free >= count)
            .map(|container| {
                let positions = &self.order[container.range.clone()];
                (container.number, positions, container.free)
            })
    }

    fn take(&mut self, position: usize) {
        if self.built {
            self.containers[self.container_at[position]].free -= 1;
        }
    }
}

impl<'a> FreeGpus<'a> {
    fn new(pool: &'a [GpuLocation], speeds: &'a GpuSpeeds, buffers: &'a mut FreeBuffers) -> Self {
        buffers.taken.clear();
        buffers.taken.resize(pool.len(), false);
        for level in &mut buffers.levels {
            level.built = false;
        }
        Self {
            pool,
            speeds,
            taken: &mut buffers.taken,
            levels: &mut buffers.levels,
        }
    }

    /// Takes `count` free GPUs from the smallest slot, else machine, else rack that has them
    /// (the fastest first, then ties to the lowest number), else the first free ones; fewer if
    /// fewer are free; `chosen` is set to their positions. Agents call this for every bundle
    /// they price, so the search reads free counts kept up to date and allocates nothing.
    fn take_best_fit(&mut self, count: usize, chosen: &mut Vec<usize>) {
        chosen.clear();
        if count == 0 {
            return;
        }
        let taken = &*self.taken;
        let (pool, speeds) = (self.pool, self.speeds);
        let mut fitting = None;
        for (index, level) in self.levels.iter_mut().enumerate() {
            if !level.built {
                level.build(pool, index, taken);
            }
            // Speeds are per slot, so a slot's GPUs share one (as all do with no table).
            let one_speed = index == SLOT || speeds.is_uniform();
            fitting = level
                .fitting(count)
                .map(|(number, positions, free)| {
                    let speed = if one_speed {
                        speeds.at(pool[positions[0]])
                    } else {
                        let first = free_positions(positions, taken).take(count);
                        speeds.slowest(first.map(|item| pool[item]))
                    };
                    (positions, free, speed, number)
                })
                .min_by(|a, b| b.2.total_cmp(&a.2).then(a.1.cmp(&b.1)).then(a.3.cmp(&b.3)))
                .map(|(positions, ..)| positions);
            if fitting.is_some() {
                break;
            }
        }
        match fitting {
            Some(positions) => chosen.extend(free_positions(positions, taken).take(count)),
            None => chosen.extend(
                (0..pool.len())
                    .filter(|&position| !taken[position])
                    .take(count),
            ),
        }
        for &position in chosen.iter() {
            self.taken[position] = true;
            for level in self.levels.iter_mut() {
                level.take(position);
            }
        }
    }
}

/// The positions in `positions` that are not `taken`, in order.
fn free_positions<'p>(
    positions: &'p [usize],
    taken: &'p [bool],
) -> impl Iterator<Item = usize> + 'p {
    positions
        .iter()
        .copied()
        .filter(move |&position| !taken[position])
}

/// The running integral of the number of active apps over time, from which each app's N_avg
/// over its own lifetime is a difference of two values ([`Lifetime`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ContentionTracker {
    last_change: Timestamp,
    active_apps: u32,
    /// Integral of the active app count over time, in app-seconds, up to `last_change`.
    integral: f64,
}

impl ContentionTracker {
    pub fn new(now: Timestamp) -> Self {
        Self {
            last_change: now,
            active_apps: 0,
            integral: 0.0,
        }
    }

    pub fn active_apps(&self) -> u32 {
        self.active_apps
    }

    /// The running integral at `now`. The tracker cannot look back in time: for a `now` before
    /// the last change (a round opened just before an app arrived) it is the value at that
    /// change. A departed app's N_avg never needs it ([`Lifetime`] keeps its own end).
    pub fn integral_at(&self, now: Timestamp) -> f64 {
        self.integral
            + f64::from(self.active_apps) * now.saturating_since(self.last_change).as_secs_f64()
    }

    fn set_active_apps(&mut self, now: Timestamp, active_apps: u32) {
        self.integral = self.integral_at(now);
        self.last_change = self.last_change.max(now);
        self.active_apps = active_apps;
    }

    /// An app arrives at `now`: one more active app. Keep the returned lifetime for its N_avg.
    pub fn arrive(&mut self, now: Timestamp) -> Lifetime {
        self.set_active_apps(now, self.active_apps + 1);
        Lifetime {
            arrival: now,
            integral_at_arrival: self.integral_at(now),
            departure: None,
        }
    }

    /// The app of `lifetime` leaves at `now`: its N_avg stops there.
    pub fn depart(&mut self, lifetime: &mut Lifetime, now: Timestamp) {
        debug_assert!(lifetime.departure.is_none(), "an app departs once");
        lifetime.departure = Some((now, self.integral_at(now)));
        self.set_active_apps(now, self.active_apps.saturating_sub(1));
    }

    /// Rebuilds the tracker at `now` from every app's arrival and, for apps that have left,
    /// departure (after a restart, from what was recorded). Returns the tracker and each app's
    /// lifetime, in the order given. Replaying the same arrivals and departures gives the same
    /// integrals, bit for bit, as tracking them live.
    pub fn replay(
        lifetimes: &[(Timestamp, Option<Timestamp>)],
        now: Timestamp,
    ) -> (Self, Vec<Lifetime>) {
        // Every arrival and departure in time order; departures (false) first at equal times,
        // which changes no integral (no time passes between them).
        let mut events: Vec<(Timestamp, bool, usize)> = Vec::with_capacity(lifetimes.len() * 2);
        for (app, &(arrival, departure)) in lifetimes.iter().enumerate() {
            events.push((arrival, true, app));
            if let Some(departure) = departure {
                events.push((departure.max(arrival), false, app));
            }
        }
        events.sort_unstable();
        let mut tracker = Self::default();
        let mut replayed: Vec<Option<Lifetime>> = vec![None; lifetimes.len()];
        for (time, arrives, app) in events {
            if arrives {
                replayed[app] = Some(tracker.arrive(time));
            } else if let Some(lifetime) = replayed[app].as_mut() {
                tracker.depart(lifetime, time);
            }
        }
        tracker.set_active_apps(now.max(tracker.last_change), tracker.active_apps);
        let lifetimes = replayed
            .into_iter()
            .map(|lifetime| lifetime.expect("every app arrives"))
            .collect();
        (tracker, lifetimes)
    }
}

/// One app's window onto the contention: the running integral when it arrived and, once it
/// has left, when it left, so that its N_avg covers its own lifetime and nothing after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lifetime {
    pub arrival: Timestamp,
    integral_at_arrival: f64,
    departure: Option<(Timestamp, f64)>,
}

impl Lifetime {
    /// When the app left, if it has.
    pub fn departure(&self) -> Option<Timestamp> {
        self.departure.map(|(time, _)| time)
    }

    /// N_avg: the time-weighted average number of active apps from the app's arrival to its
    /// departure, or to `now` while it is active. At the instant of arrival it is the number
    /// of active apps. Never below 1 (the app itself is active).
    pub fn average_contention(&self, tracker: &ContentionTracker, now: Timestamp) -> f64 {
        let (end, integral_at_end) = self
            .departure
            .unwrap_or_else(|| (now, tracker.integral_at(now)));
        let elapsed = end.saturating_since(self.arrival).as_secs_f64();
        if elapsed <= 0.0 {
            let active = if self.departure.is_some() {
                1
            } else {
                tracker.active_apps()
            };
            return f64::from(active.max(1));
        }
        ((integral_at_end - self.integral_at_arrival) / elapsed).max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{AppId, Job, PlacementSlowdown, SuccessiveHalving};
    use crate::topology::{Cluster, ClusterSpec};

    fn job(id: &str, serial: f64, total: u64) -> Job {
        Job {
            id: id.into(),
            total_iterations: total,
            completed_iterations: 0,
            serial_iteration_time: serial,
            max_gpus: 8,
            slowdown: PlacementSlowdown::NONE,
            stopped: false,
            speed_changes: Vec::new(),
        }
    }

    /// The §4.3.3 example: a successive-halving app of 4 jobs on a 16-GPU cluster shared by 4
    /// apps, phases of 8/16/36 iterations, budget 10,000 GPU-seconds, demand max 8, S = 1.
    fn worked_example() -> (App, FairnessContext) {
        let jobs = [("a", 80.0), ("b", 100.0), ("c", 100.0), ("d", 120.0)]
            .map(|(id, serial)| job(id, serial, 60))
            .to_vec();
        let app = App {
            id: AppId::from("hyperband"),
            kind: AppKind::SuccessiveHalving(SuccessiveHalving {
                budget_gpu_seconds: 10_000.0,
                phase_iterations: vec![8, 16, 36],
                jobs_per_phase: vec![4, 2, 1],
                max_gpus_per_phase: Vec::new(),
                current_phase: 0,
                jobs,
                throughput: Default::default(),
                sensitivity: Default::default(),
            }),
        };
        // The paper's T_cluster, B / min(R_C, demand) = 10,000 / 16, and no restart pause:
        // the example's inputs, so that T_id is its 2,500 s.
        let context = FairnessContext {
            now: Timestamp(0),
            arrival: Timestamp(0),
            cluster_seconds: 625.0,
            average_contention: 4.0,
            restart_pause_seconds: 0.0,
            speeds: GpuSpeeds::UNIFORM,
        };
        (app, context)
    }

    fn sixteen_gpus() -> Vec<GpuLocation> {
        let cluster = Cluster::from_spec(&ClusterSpec::uniform(1, 2, 1, 8)).expect("valid spec");
        cluster.gpus().map(|(_, gpu)| gpu.location).collect()
    }

    /// The paper's Table 3 prints 4, 2, 1, 0.5 and 0.34; those are rounded. With the same rules
    /// (upper-median job for future phases, demand max 8) the exact values for 4, 8 and 16 GPUs
    /// are 2660/2500, 1330/2500 and 890/2500, which is what we assert.
    #[test]
    fn reproduces_the_worked_example_of_section_4_3_3() {
        let (app, context) = worked_example();
        assert_eq!(independent_finish_time(&context), 2500.0);
        let gpus = sixteen_gpus();
        let rho_with = |count: usize| rho(&app, &gpus[..count], &context).map(Rho::get);
        let plan = PhasePlan::remaining(&app, 2);
        assert_eq!(shared_finish_time(&plan, &gpus[..2], &context), 5000.0);
        for (count, expected) in [(1, 4.0), (2, 2.0), (4, 1.064), (8, 0.532), (16, 0.356)] {
            let value = rho_with(count).expect("finite rho");
            assert!(
                (value - expected).abs() < 1e-12,
                "{count} GPUs: rho {value}, expected {expected}"
            );
        }
        assert_eq!(rho_with(0), None, "no GPUs means an unbounded finish time");
    }

    #[test]
    fn a_plan_prices_gpus_of_any_count_as_a_plan_of_their_own_count_does() {
        let (app, mut context) = worked_example();
        context.restart_pause_seconds = 35.0;
        let gpus = sixteen_gpus();
        let plan_for_four = PhasePlan::remaining(&app, 4);
        for range in [0..4, 6..10, 12..16, 0..8, 4..16, 0..1] {
            let gpus = &gpus[range.clone()];
            let own = PhasePlan::remaining(&app, gpus.len());
            let (speeds, pause) = (&context.speeds, context.restart_pause_seconds);
            assert_eq!(
                plan_for_four.time_on(gpus, speeds, pause),
                own.time_on(gpus, speeds, pause),
                "GPUs {range:?}"
            );
            assert_eq!(rho_of_plan(&own, gpus, &context), rho(&app, gpus, &context));
        }
    }

    #[test]
    fn revised_estimate_uses_the_jobs_that_survived() {
        // §4.3.3: if the jobs kept for phase 2 take 120 s and 100 s per iteration, the 2-GPU
        // estimate of phase 2 becomes 120 x 16 and of phase 3 becomes 120 x 36 / 2.
        let (mut app, _) = worked_example();
        let AppKind::SuccessiveHalving(search) = &mut app.kind else {
            unreachable!()
        };
        for job in &mut search.jobs {
            job.completed_iterations = 8;
        }
        search.advance_phase(&["b", "d"]);
        let gpus = sixteen_gpus();
        assert_eq!(
            remaining_time(&app, &gpus[..2], &GpuSpeeds::UNIFORM, 0.0),
            120.0 * 16.0 + 120.0 * 36.0 / 2.0
        );
    }

    #[test]
    fn single_job_follows_equation_one() {
        let mut single = job("j", 10.0, 100);
        single.completed_iterations = 40;
        single.max_gpus = 4;
        single.slowdown = PlacementSlowdown::default();
        let app = App {
            id: AppId::from("single"),
            kind: AppKind::SingleJob {
                job: single,
                throughput: Default::default(),
                sensitivity: Default::default(),
            },
        };
        let eight = sixteen_gpus();
        let cluster_seconds = cluster_time(&app, &sixteen_gpus(), &GpuSpeeds::UNIFORM, 35.0);
        assert_eq!(
            cluster_seconds,
            60.0 * 10.0 / 4.0,
            "the job's 60 iterations left, on 4 GPUs"
        );
        let context = FairnessContext {
            now: Timestamp::from_secs_f64(500.0),
            arrival: Timestamp(0),
            cluster_seconds,
            average_contention: 2.0,
            restart_pause_seconds: 35.0,
            speeds: GpuSpeeds::UNIFORM,
        };
        // T_id = 150 * 2 = 300; two GPUs on two racks: S = 1.3.
        let across_racks = [
            GpuLocation {
                rack: 0,
                machine: 0,
                slot: 0,
            },
            GpuLocation {
                rack: 1,
                machine: 1,
                slot: 1,
            },
        ];
        let expected = (500.0 + 60.0 * 10.0 * 1.3 / 2.0) / 300.0;
        let value = rho(&app, &across_racks, &context).expect("finite").get();
        assert!((value - expected).abs() < 1e-12);
        // More GPUs than the job's demand do not help.
        assert_eq!(
            remaining_time(&app, &eight[..8], &GpuSpeeds::UNIFORM, 35.0),
            remaining_time(&app, &eight[..4], &GpuSpeeds::UNIFORM, 35.0)
        );
    }

    /// T_cluster under the job model is what the app takes holding the whole cluster: for the
    /// §4.3.3 example on 16 GPUs, phases of 4 jobs x 4 GPUs (8 iterations of the slowest job,
    /// 120 s: 240 s), 2 median jobs x 8 GPUs (16 x 100 / 8 = 200 s) and 1 x 8 GPUs
    /// (36 x 100 / 8 = 450 s): 890 s, the paper's T_sh(16 GPUs); plus one restart pause, where
    /// the jobs grow from 4 to 8 GPUs.
    #[test]
    fn cluster_time_is_the_job_model_on_the_whole_cluster() {
        let (app, context) = worked_example();
        assert_eq!(
            cluster_time(&app, &sixteen_gpus(), &GpuSpeeds::UNIFORM, 0.0),
            890.0
        );
        assert_eq!(
            cluster_time(&app, &sixteen_gpus(), &GpuSpeeds::UNIFORM, 35.0),
            925.0
        );
        let alone = FairnessContext {
            cluster_seconds: cluster_time(&app, &sixteen_gpus(), &GpuSpeeds::UNIFORM, 35.0),
            average_contention: 1.0,
            restart_pause_seconds: 35.0,
            ..context
        };
        let value = rho(&app, &sixteen_gpus(), &alone).expect("finite").get();
        assert_eq!(
            value, 1.0,
            "an app alone holding the whole cluster has rho 1"
        );
    }

    /// Two 2-GPU jobs fill the two 2-GPU machines first (best fit), then one 4-GPU job grows
    /// out of them: it restarts anyway, so it moves to the 4-GPU machine (slowdown 1.1) rather
    /// than spanning the two small ones (1.5): 50 s + 35 s pause + 400 x 1.1 / 4 s.
    #[test]
    fn resized_jobs_move_to_better_placed_gpus() {
        let at = |machine, slot| GpuLocation {
            rack: 0,
            machine,
            slot,
        };
        let gpus = [
            at(0, 0),
            at(0, 0),
            at(1, 1),
            at(1, 1),
            at(2, 2),
            at(2, 2),
            at(2, 3),
            at(2, 3),
        ];
        let job = |iterations: f64, max_gpus| JobInfo {
            iterations_remaining: iterations,
            serial_iteration_time: 1.0,
            max_gpus,
            slowdown: PlacementSlowdown {
                same_slot: 1.0,
                same_machine: 1.1,
                same_rack: 1.5,
                cross_rack: 2.0,
            },
            speed_changes_ahead: 0,
        };
        let phases = [vec![job(100.0, 2), job(100.0, 2)], vec![job(400.0, 4)]];
        let expected = 50.0 + 35.0 + 400.0 * 1.1 / 4.0;
        let time =
            PhasePlan::new(phases.to_vec(), gpus.len()).time_on(&gpus, &GpuSpeeds::UNIFORM, 35.0);
        assert!((time - expected).abs() < 1e-9);
    }

    #[test]
    fn contention_is_time_weighted_over_the_apps_own_lifetime() {
        let at = Timestamp::from_secs_f64;
        let mut tracker = ContentionTracker::new(Timestamp(0));
        let mut first = tracker.arrive(Timestamp(0));
        let mut second = tracker.arrive(at(100.0));
        let _third = tracker.arrive(at(100.0));
        tracker.depart(&mut first, at(200.0));
        // The second app: 100 s with 3 apps then 100 s with 2: N_avg = 2.5 at t = 300.
        assert_eq!(second.average_contention(&tracker, at(300.0)), 2.5);
        tracker.depart(&mut second, at(300.0));
        // The first app: 100 s alone, 100 s with 3 apps: 2, and it stays 2 however long the
        // others run after it left.
        let later = tracker.arrive(at(5000.0));
        assert_eq!(first.average_contention(&tracker, at(9000.0)), 2.0);
        assert_eq!(second.average_contention(&tracker, at(9000.0)), 2.5);
        assert_eq!(
            later.average_contention(&tracker, at(5000.0)),
            2.0,
            "at arrival: the count"
        );
    }

    #[test]
    fn replaying_arrivals_and_departures_gives_the_same_integrals() {
        let at = |ms: u64| Timestamp(ms);
        let mut live = ContentionTracker::new(Timestamp(0));
        let mut a = live.arrive(at(1_000));
        let b = live.arrive(at(2_500));
        live.depart(&mut a, at(7_123));
        let c = live.arrive(at(9_000));
        let now = at(12_345);
        let (replayed, lifetimes) = ContentionTracker::replay(
            &[
                (at(2_500), None),
                (at(1_000), Some(at(7_123))),
                (at(9_000), None),
            ],
            now,
        );
        assert_eq!(lifetimes, vec![b, a, c]);
        assert_eq!(replayed.integral_at(now), live.integral_at(now));
        assert_eq!(replayed.active_apps(), 2);
    }
}
