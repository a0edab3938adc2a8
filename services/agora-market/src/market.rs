//! The round-by-round mechanism (Themis Pseudocode 1, lines 13-23), the one entry point the
//! simulator and the service drive.
//!
//! On every resource-available event (a lease expiring, a job or app finishing, an app
//! arriving, GPUs added or removed) the caller runs a round: the active apps are sorted by
//! their current rho, the worst ceil((1-f)*N) with unmet demand are offered the free GPUs, they
//! bid, the auction decides, the leftovers go to the other apps, and every allocation becomes a
//! lease of length L. A round is split in two ([`Market::open_round`] and
//! [`Market::close_round`]) so that agents living elsewhere (HPO frameworks over HTTP) can bid
//! in between; [`Market::run_round`] does both with the engine's own agents. The decision
//! itself is [`crate::round::decide_round`], a pure function of the inputs a round records.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::app::{App, AppId};
use crate::auction::{run_auction, AppBid, AuctionOutcome, Offer, OfferedGpu};
use crate::baselines::{self, Contender, RoundView};
use crate::bids::{generate_bid, BidConfig, PreparedOffer};
use crate::division::{DivisionRecord, Holder, RecordedLease, RecordedMachine};
use crate::fairness::{
    cluster_time, independent_finish_time, rho, ContentionTracker, FairnessContext, Lifetime,
};
use crate::hosts::{Host, HostDirectory, HostSpec};
use crate::lease::{Lease, LeaseBook, LeaseId};
use crate::leftover::{LeftoverPolicy, Recipient};
use crate::parallel::parallel_map;
use crate::policy::Policy;
use crate::resources::{MachineResources, MachineTenants, ResourceAllocation, ResourceSplit};
use crate::rho::RhoOld;
use crate::round::{
    decide_round, decide_with, merge, offered_subset, Grants, RoundDecision, RoundInputs,
};
use crate::throughput::{GpuSpeeds, Throughput, ThroughputReport};
use crate::time::Timestamp;
use crate::topology::{Cluster, GpuId, GpuIndex, GpuLocation};

pub use crate::error::MarketError;
pub use crate::round::Standing;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MarketConfig {
    /// Themis's f in (0, 1): the worst (1 - f) fraction of apps by rho bid in each round.
    pub fairness_knob: f64,
    /// L: how long a lease lasts.
    #[serde(with = "crate::time::duration_seconds")]
    pub lease_length: Duration,
    pub bids: BidConfig,
    pub leftover_policy: LeftoverPolicy,
    /// Themis, or a baseline to compare it with.
    #[serde(default)]
    pub policy: Policy,
    /// How long a job pauses to checkpoint and restore when its GPUs change (§6.2.3 measures
    /// about 35 s). The job model counts it where a plan resizes jobs.
    #[serde(
        with = "crate::time::duration_seconds",
        default = "default_restart_pause"
    )]
    pub restart_pause: Duration,
    /// How each machine's CPUs and memory are divided among the apps holding its GPUs, where
    /// the cluster gives them ([`crate::resources`]).
    #[serde(default, skip_serializing_if = "ResourceAllocation::is_default")]
    pub resource_allocation: ResourceAllocation,
}

fn default_restart_pause() -> Duration {
    Duration::from_secs(35)
}

impl Default for MarketConfig {
    fn default() -> Self {
        Self {
            fairness_knob: 0.8,
            lease_length: Duration::from_secs(600),
            bids: BidConfig::default(),
            leftover_policy: LeftoverPolicy::default(),
            policy: Policy::default(),
            restart_pause: default_restart_pause(),
            resource_allocation: ResourceAllocation::default(),
        }
    }
}

impl MarketConfig {
    /// How many of the worst apps by rho are offered GPUs in a round: ceil((1 - f) N), at
    /// least one.
    pub fn bidders_per_round(&self, active_apps: usize) -> usize {
        ((1.0 - self.fairness_knob) * active_apps as f64)
            .ceil()
            .max(1.0) as usize
    }
}

/// An active app and what fairness needs to remember about it.
#[derive(Debug, Clone)]
struct Participant {
    app: App,
    lifetime: Lifetime,
    /// T_cluster, fixed when the app arrived.
    cluster_seconds: f64,
    /// GPU-seconds of the app's leases that have ended.
    ended_gpu_seconds: f64,
}

/// What a restart needs to bring an app back as it was: what the market recorded of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordedApp {
    pub arrival: Timestamp,
    /// T_cluster as computed when the app arrived ([`Market::cluster_time`]).
    pub cluster_seconds: f64,
    /// GPU-seconds of the app's leases that had ended.
    pub ended_gpu_seconds: f64,
}

/// Why a GPU is out of service. A GPU is offered only while it has no reason at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Withdrawal {
    /// An operator drained it.
    Drained,
    /// Its host's worker reported it unhealthy.
    Unhealthy,
    /// Its host stopped heartbeating.
    HostDown,
    /// Its host registered again without it.
    Unreported,
}

/// What a host's registration changed.
#[derive(Debug, Clone, PartialEq)]
pub struct HostJoined {
    pub host: Host,
    /// GPUs the cluster did not have before, appended.
    pub added: Vec<GpuIndex>,
    /// The host's GPUs that it no longer reports: out of service.
    pub unreported: Vec<GpuIndex>,
    /// Leases revoked because they held an unreported GPU.
    pub revoked: Vec<Lease>,
}

/// The engine's state: the cluster, the active apps and the leases.
///
/// Cloning is cheap: the service stages every decision on a clone. The cluster and each app
/// are shared between clones and copied only when a clone changes them.
#[derive(Debug, Clone)]
pub struct Market {
    config: MarketConfig,
    cluster: Arc<Cluster>,
    hosts: HostDirectory,
    withdrawn: BTreeMap<GpuIndex, BTreeSet<Withdrawal>>,
    participants: BTreeMap<AppId, Arc<Participant>>,
    leases: LeaseBook,
    contention: ContentionTracker,
    /// GPUs whose lease each app held until it expired, since the last round: the app still
    /// stands as if it held them, and may renew onto them.
    claims: BTreeMap<AppId, BTreeSet<GpuIndex>>,
    /// Each machine's CPUs and memory as divided after the last round, by app.
    resource_split: Arc<ResourceSplit<AppId>>,
}

/// The visibility phase of a round: what is offered, and to whom.
#[derive(Debug, Clone)]
pub struct RoundOffer {
    pub now: Timestamp,
    pub offer: PreparedOffer,
    /// The apps invited to bid, worst rho first.
    pub bidders: Vec<AppId>,
    /// Every active app, worst rho first.
    pub standings: Vec<Standing>,
}

/// Everything a round decided, with the inputs needed to recompute it ([`Self::inputs`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundOutcome {
    pub now: Timestamp,
    pub seed: u64,
    pub offer: Offer,
    pub policy: Policy,
    pub standings: Vec<Standing>,
    /// The apps invited to bid, worst rho first; empty under a baseline policy.
    pub bidders: Vec<AppId>,
    /// Where each app's leased GPUs were when the round was decided; apps holding none are
    /// left out.
    pub holds: BTreeMap<AppId, Vec<GpuLocation>>,
    /// Offered GPUs whose lease each app held until this round.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<AppId, Vec<GpuId>>,
    /// The configured leftover policy (only Themis rounds have leftovers).
    pub leftover_policy: LeftoverPolicy,
    /// The bids and the auction's decision; `None` under a baseline policy.
    pub auction: Option<AuctionRecord>,
    /// GPUs handed out after the auction, by the leftover policy and then to any app with
    /// unmet demand so that no offered GPU stays idle.
    pub leftover_grants: BTreeMap<AppId, Vec<GpuId>>,
    /// Every allocation of the round, as leases.
    pub leases: Vec<Lease>,
    /// Apps of the standings that left the market before the round was decided (their bids
    /// withdrawn, their share handed to the others).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub departed: BTreeSet<AppId>,
}

/// An app's rho now and with a hypothetical allocation ([`Market::rho_projection`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RhoProjection {
    pub current: RhoOld,
    pub projected: RhoOld,
}

/// A round decided by [`Market::decide_round`], waiting for [`Market::apply_round`].
#[derive(Debug)]
pub struct DecidedRound {
    inputs: RoundInputs,
    decision: RoundDecision,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuctionRecord {
    pub bids: Vec<AppBid>,
    pub outcome: AuctionOutcome,
}

impl RoundOutcome {
    /// What [`decide_round`] needs to recompute this round's decision: store it to audit the
    /// round. `None` for a baseline round, which runs no auction.
    pub fn inputs(&self) -> Option<RoundInputs> {
        let auction = self.auction.as_ref()?;
        Some(RoundInputs {
            now: self.now,
            seed: self.seed,
            offer: self.offer.clone(),
            bidders: self.bidders.clone(),
            standings: self.standings.clone(),
            holds: self.holds.clone(),
            claims: self.claims.clone(),
            bids: auction.bids.clone(),
            leftover_policy: self.leftover_policy,
            departed: self.departed.clone(),
        })
    }
}

/// A snapshot of one app for its agent: its jobs, where its GPUs are and its fairness context.
#[derive(Debug, Clone)]
pub struct BidInputs {
    pub app: App,
    pub held: Vec<GpuLocation>,
    /// Offered GPUs whose lease the app held until this round.
    pub claimed: Vec<GpuId>,
    pub context: FairnessContext,
    pub config: BidConfig,
}

impl BidInputs {
    /// The agent's bid (Themis §3.3.1): rho_old and the best bundles of `offer`.
    pub fn bid(&self, offer: &PreparedOffer) -> AppBid {
        generate_bid(
            &self.app,
            &self.held,
            &self.claimed,
            offer,
            &self.context,
            &self.config,
        )
    }
}

impl Market {
    pub fn new(
        cluster: Cluster,
        config: MarketConfig,
        now: Timestamp,
    ) -> Result<Self, MarketError> {
        if !(0.0..1.0).contains(&config.fairness_knob) {
            return Err(MarketError::InvalidFairnessKnob(config.fairness_knob));
        }
        Ok(Self {
            config,
            cluster: Arc::new(cluster),
            hosts: HostDirectory::default(),
            withdrawn: BTreeMap::new(),
            participants: BTreeMap::new(),
            leases: LeaseBook::new(),
            contention: ContentionTracker::new(now),
            claims: BTreeMap::new(),
            resource_split: Arc::default(),
        })
    }

    pub fn config(&self) -> &MarketConfig {
        &self.config
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn leases(&self) -> &LeaseBook {
        &self.leases
    }

    pub fn apps(&self) -> impl Iterator<Item = &App> {
        self.participants
            .values()
            .map(|participant| &participant.app)
    }

    pub fn app(&self, id: &AppId) -> Option<&App> {
        self.participants
            .get(id)
            .map(|participant| &participant.app)
    }

    /// For progress reports: completed iterations, observed slowdowns, jobs stopped, phases.
    pub fn app_mut(&mut self, id: &AppId) -> Option<&mut App> {
        self.participants
            .get_mut(id)
            .map(|participant| &mut Arc::make_mut(participant).app)
    }

    /// T_cluster of `app` on this market's cluster now: its finish time holding every GPU.
    pub fn cluster_time(&self, app: &App) -> f64 {
        let cluster: Vec<GpuLocation> = self.cluster.gpus().map(|(_, gpu)| gpu.location).collect();
        cluster_time(
            app,
            &cluster,
            &self.speeds(app),
            self.config.restart_pause.as_secs_f64(),
        )
    }

    /// `app`'s speed on each GPU of the cluster as it is now: its speed on the GPU's type
    /// and, where the cluster gives CPUs or memory and the app has a profile, the speed its
    /// share of the machine gives it: the share it got in the last round on machines where it
    /// holds GPUs, its GPU-proportional share (its guaranteed speed) elsewhere.
    fn speeds(&self, app: &App) -> GpuSpeeds {
        let by_type = GpuSpeeds::of(app.throughput(), &self.cluster);
        let sensitivity = app.sensitivity();
        if sensitivity.is_empty() || !self.cluster.models_resources() {
            return by_type;
        }
        let gpus_per_machine = self.cluster.gpus_per_machine();
        by_type.scaled_per_machine(&self.cluster, |machine| {
            self.resource_split.share(&app.id, machine).map_or_else(
                || {
                    sensitivity.proportional_speed(
                        &self.cluster.machine_resources(machine),
                        gpus_per_machine[&machine],
                    )
                },
                |share| share.speed,
            )
        })
    }

    /// `app`'s speed on each GPU of the cluster as it is now ([`Self::speeds`]), for the
    /// simulator, which runs jobs at the speed their shares give them.
    pub fn app_speeds(&self, app: &AppId) -> Option<GpuSpeeds> {
        Some(self.speeds(&self.participants.get(app)?.app))
    }

    /// The CPUs and memory of each machine as divided after the last round.
    pub fn resource_split(&self) -> &ResourceSplit<AppId> {
        &self.resource_split
    }

    /// Whether `app`'s throughput table gives a speed for every GPU type of the cluster (an
    /// app with no table runs at one speed on all), and its sensitivity profile asks no machine
    /// for more than it has.
    pub fn check_throughput(&self, app: &App) -> Result<(), MarketError> {
        app.throughput()
            .check_covers(&self.cluster)
            .and_then(|()| {
                app.sensitivity()
                    .check_fits(&self.cluster.largest_machine())
            })
            .map_err(|reason| MarketError::Throughput(app.id.clone(), reason))
    }

    /// A framework measured `app`'s speed on one GPU type: the app's table takes it
    /// ([`Throughput::reported`]) and its rho and bids use it from now on. T_cluster, fixed
    /// when the app arrived, stays: an app's T_id does not move under it.
    pub fn report_throughput(
        &mut self,
        app: &AppId,
        report: &ThroughputReport,
    ) -> Result<&Throughput, MarketError> {
        let participant = self
            .participants
            .get_mut(app)
            .ok_or_else(|| MarketError::UnknownApp(app.clone()))?;
        let updated = participant
            .app
            .throughput()
            .reported(report, &self.cluster)?;
        let app = &mut Arc::make_mut(participant).app;
        *app.throughput_mut() = updated;
        Ok(app.throughput())
    }

    /// After a restart, once apps and leases are restored: divides the machines' CPUs and
    /// memory among the apps holding their GPUs, as a round's grants would.
    pub fn restore_resource_split(&mut self) {
        self.divide_resources();
    }

    /// The CPUs and memory that come with `lease` on each machine it holds GPUs on: its app's
    /// share there divided among the app's leases by GPUs ([`ResourceSplit::parts_for`]).
    /// Unmodelled machines give `None`s.
    pub fn lease_resources(&self, lease: &Lease) -> BTreeMap<u32, MachineResources> {
        let gpus_per_machine = self.cluster.gpus_per_machine();
        self.resource_split
            .parts_for(&lease.app, &self.gpus_on_machines(lease), |machine| {
                (
                    self.cluster.machine_resources(machine),
                    gpus_per_machine[&machine],
                )
            })
    }

    /// How many of `lease`'s GPUs each machine has.
    fn gpus_on_machines(&self, lease: &Lease) -> BTreeMap<u32, u32> {
        let mut gpus_on: BTreeMap<u32, u32> = BTreeMap::new();
        for &gpu in &lease.gpus {
            *gpus_on
                .entry(self.cluster.location(gpu).machine)
                .or_insert(0) += 1;
        }
        gpus_on
    }

    /// The division of the machines as it stands and every active lease's GPUs per machine:
    /// what `agora audit replay` divides again ([`DivisionRecord::lease_resources`]). `None` on
    /// a cluster that models neither resource.
    pub fn division_record(&self) -> Option<DivisionRecord> {
        if !self.cluster.models_resources() {
            return None;
        }
        let gpus_per_machine = self.cluster.gpus_per_machine();
        let leases: Vec<RecordedLease> = self
            .leases
            .active()
            .map(|lease| RecordedLease {
                lease: lease.id,
                app: lease.app.clone(),
                gpus_on: self.gpus_on_machines(lease),
            })
            .collect();
        let mut machines: BTreeMap<u32, RecordedMachine> = self
            .resource_split
            .divided()
            .map(|(number, resources, holders)| {
                let machine = RecordedMachine {
                    machine: number,
                    resources: *resources,
                    gpus: gpus_per_machine[&number],
                    holders: holders
                        .iter()
                        .map(|(app, gpus, sensitivity)| Holder {
                            app: app.clone(),
                            gpus: *gpus,
                            sensitivity: sensitivity.clone(),
                        })
                        .collect(),
                };
                (number, machine)
            })
            .collect();
        // Machines a lease holds GPUs on that no division covers: their shares by GPUs.
        for number in leases.iter().flat_map(|lease| lease.gpus_on.keys()) {
            machines.entry(*number).or_insert_with(|| RecordedMachine {
                machine: *number,
                resources: self.cluster.machine_resources(*number),
                gpus: gpus_per_machine[number],
                holders: Vec::new(),
            });
        }
        Some(DivisionRecord {
            allocation: self.config.resource_allocation,
            machines: machines.into_values().collect(),
            leases,
        })
    }

    /// Divides every machine's CPUs and memory among the apps holding its GPUs now (by the
    /// configured [`ResourceAllocation`]); a machine whose holders are unchanged keeps its split.
    fn divide_resources(&mut self) {
        if !self.cluster.models_resources() {
            return;
        }
        let split = ResourceSplit::divide(
            self.machine_tenants(),
            self.config.resource_allocation,
            &self.resource_split,
        );
        self.resource_split = Arc::new(split);
    }

    /// Every machine's CPUs and memory, GPUs, and the apps holding its GPUs now (how many, and
    /// their profiles); empty on a cluster that models neither resource.
    fn machine_tenants(&self) -> BTreeMap<u32, MachineTenants<'_, AppId>> {
        if !self.cluster.models_resources() {
            return BTreeMap::new();
        }
        let gpus_per_machine = self.cluster.gpus_per_machine();
        let mut machines: BTreeMap<u32, MachineTenants<AppId>> = gpus_per_machine
            .iter()
            .map(|(&machine, &gpus)| {
                let tenants = MachineTenants {
                    resources: self.cluster.machine_resources(machine),
                    gpus,
                    tenants: Vec::new(),
                };
                (machine, tenants)
            })
            .collect();
        for (id, participant) in &self.participants {
            let mut held: BTreeMap<u32, u32> = BTreeMap::new();
            for lease in self.leases.leases_of(id) {
                for &gpu in &lease.gpus {
                    *held.entry(self.cluster.location(gpu).machine).or_insert(0) += 1;
                }
            }
            for (machine, gpus) in held {
                if let Some(entry) = machines.get_mut(&machine) {
                    entry
                        .tenants
                        .push((id.clone(), gpus, participant.app.sensitivity()));
                }
            }
        }
        machines
    }

    /// An app arrives; its T_cluster is computed on the cluster as it is now.
    pub fn add_app(&mut self, app: App, now: Timestamp) -> Result<(), MarketError> {
        let cluster_seconds = self.cluster_time(&app);
        self.admit(app, now, cluster_seconds)
    }

    /// An app arrives with a T_cluster the caller computed ([`Self::cluster_time`]) and
    /// recorded, so that a restart restores exactly the same value.
    pub fn admit(
        &mut self,
        app: App,
        now: Timestamp,
        cluster_seconds: f64,
    ) -> Result<(), MarketError> {
        if self.participants.contains_key(&app.id) {
            return Err(MarketError::DuplicateApp(app.id));
        }
        self.check_throughput(&app)?;
        let participant = Participant {
            app,
            lifetime: self.contention.arrive(now),
            cluster_seconds,
            ended_gpu_seconds: 0.0,
        };
        self.participants
            .insert(participant.app.id.clone(), Arc::new(participant));
        Ok(())
    }

    /// Restores active apps after a restart, as they were recorded, and the contention history
    /// from every recorded app's arrival and, for the apps that have left (`departed`, as
    /// arrival and departure), departure: each app's N_avg is then what it was before the
    /// restart. Restore them all at once, before restoring leases, adding apps or running a
    /// round.
    pub fn restore_apps(
        &mut self,
        apps: Vec<(App, RecordedApp)>,
        departed: &[(Timestamp, Timestamp)],
        now: Timestamp,
    ) -> Result<(), MarketError> {
        let mut lifetimes: Vec<(Timestamp, Option<Timestamp>)> = apps
            .iter()
            .map(|(_, recorded)| (recorded.arrival, None))
            .collect();
        lifetimes.extend(
            departed
                .iter()
                .map(|&(arrival, departure)| (arrival, Some(departure))),
        );
        let (contention, replayed) = ContentionTracker::replay(&lifetimes, now);
        let mut participants = BTreeMap::new();
        for ((app, recorded), lifetime) in apps.into_iter().zip(replayed) {
            if participants.contains_key(&app.id) || self.participants.contains_key(&app.id) {
                return Err(MarketError::DuplicateApp(app.id));
            }
            let participant = Participant {
                app,
                lifetime,
                cluster_seconds: recorded.cluster_seconds,
                ended_gpu_seconds: recorded.ended_gpu_seconds,
            };
            participants.insert(participant.app.id.clone(), Arc::new(participant));
        }
        self.participants = participants;
        self.contention = contention;
        Ok(())
    }

    /// Restores an active lease after a restart, keeping its id. Its app must be restored
    /// first, and its GPUs must be in the cluster and in no other active lease.
    pub fn restore_lease(&mut self, lease: Lease) -> Result<(), MarketError> {
        if !self.participants.contains_key(&lease.app) {
            return Err(MarketError::UnknownApp(lease.app));
        }
        if let Some(&gpu) = lease
            .gpus
            .iter()
            .find(|gpu| gpu.get() >= self.cluster.len())
        {
            return Err(MarketError::GpuOutsideCluster(gpu));
        }
        Ok(self.leases.restore(lease)?)
    }

    /// The GPUs each app's lease ended on since the last round: to restore after a restart.
    pub fn claims(&self) -> impl Iterator<Item = (&AppId, Vec<GpuIndex>)> {
        self.claims
            .iter()
            .map(|(app, gpus)| (app, gpus.iter().copied().collect()))
    }

    /// Restores an app's claim on GPUs whose lease ended since the last round (after a
    /// restart, from the leases that expired after the last round closed). Its app must be
    /// restored first.
    pub fn restore_claim(&mut self, app: AppId, gpus: Vec<GpuIndex>) -> Result<(), MarketError> {
        if !self.participants.contains_key(&app) {
            return Err(MarketError::UnknownApp(app));
        }
        if let Some(&gpu) = gpus.iter().find(|gpu| gpu.get() >= self.cluster.len()) {
            return Err(MarketError::GpuOutsideCluster(gpu));
        }
        self.claims.entry(app).or_default().extend(gpus);
        Ok(())
    }

    /// After a restart: new leases get ids from `next` on, so they do not clash with recorded
    /// leases that ended before it (restoring a lease only reserves the ids up to its own).
    pub fn issue_lease_ids_from(&mut self, next: LeaseId) {
        self.leases.issue_ids_from(next);
    }

    /// When the app arrived, to record so it can be restored.
    pub fn arrival(&self, id: &AppId) -> Option<Timestamp> {
        self.participants
            .get(id)
            .map(|participant| participant.lifetime.arrival)
    }

    /// The app's T_cluster, to record so it can be restored.
    pub fn cluster_seconds(&self, id: &AppId) -> Option<f64> {
        self.participants
            .get(id)
            .map(|participant| participant.cluster_seconds)
    }

    /// GPU-seconds of the app's leases that have ended, to record so it can be restored.
    pub fn ended_gpu_seconds(&self, id: &AppId) -> Option<f64> {
        self.participants
            .get(id)
            .map(|participant| participant.ended_gpu_seconds)
    }

    /// The app is done (or withdrawn): its leases end and it leaves the market.
    pub fn remove_app(&mut self, id: &AppId, now: Timestamp) -> Result<Vec<Lease>, MarketError> {
        let participant = self
            .participants
            .remove(id)
            .ok_or_else(|| MarketError::UnknownApp(id.clone()))?;
        let mut lifetime = participant.lifetime;
        self.contention.depart(&mut lifetime, now);
        self.claims.remove(id);
        let held: Vec<LeaseId> = self.leases.leases_of(id).map(|lease| lease.id).collect();
        Ok(held
            .into_iter()
            .filter_map(|lease| self.leases.release(lease, now).ok())
            .collect())
    }

    /// Ends the leases due by `now`. Their apps keep a claim on the GPUs until the next round.
    pub fn expire_leases(&mut self, now: Timestamp) -> Vec<Lease> {
        let expired = self.leases.expire_due(now);
        self.credit_ended(&expired);
        for lease in &expired {
            self.claims
                .entry(lease.app.clone())
                .or_default()
                .extend(lease.gpus.iter().copied());
        }
        expired
    }

    /// `app` gives `gpus` back early (its jobs no longer need them): each lease holding some of
    /// them ends, and what it held besides goes on under a new lease to the same end.
    pub fn release_gpus(
        &mut self,
        app: &AppId,
        gpus: &[GpuIndex],
        now: Timestamp,
    ) -> Result<(), MarketError> {
        let affected: Vec<Lease> = self
            .leases
            .leases_of(app)
            .filter(|lease| lease.gpus.iter().any(|gpu| gpus.contains(gpu)))
            .cloned()
            .collect();
        for lease in affected {
            self.release_lease(lease.id, now)?;
            let kept: Vec<GpuIndex> = lease
                .gpus
                .iter()
                .copied()
                .filter(|gpu| !gpus.contains(gpu))
                .collect();
            let left = lease.end.saturating_since(now);
            if kept.is_empty() {
                continue;
            }
            if left.is_zero() {
                // The lease ends now anyway: the app claims the rest, as at an expiry.
                self.claims.entry(app.clone()).or_default().extend(kept);
            } else {
                self.leases.grant(app.clone(), kept, now, left)?;
            }
        }
        Ok(())
    }

    pub fn release_lease(&mut self, id: LeaseId, now: Timestamp) -> Result<Lease, MarketError> {
        let released = self.leases.release(id, now)?;
        self.credit_ended(std::slice::from_ref(&released));
        Ok(released)
    }

    /// An operator takes a GPU out of service (revoking the lease holding it) or puts it back.
    pub fn set_gpu_health(
        &mut self,
        gpu: GpuIndex,
        healthy: bool,
        now: Timestamp,
    ) -> Option<Lease> {
        self.set_withdrawn(gpu, Withdrawal::Drained, !healthy);
        if healthy {
            return None;
        }
        self.revoke_gpu(gpu, now)
    }

    /// Adds or removes one reason for `gpu` to be out of service. Leases are untouched: a
    /// lease on a withdrawn GPU runs until [`Self::revoke_gpu`] (after a notice, say).
    pub fn set_withdrawn(&mut self, gpu: GpuIndex, reason: Withdrawal, withdrawn: bool) {
        if withdrawn {
            self.withdrawn.entry(gpu).or_default().insert(reason);
        } else if let Some(reasons) = self.withdrawn.get_mut(&gpu) {
            reasons.remove(&reason);
            if reasons.is_empty() {
                self.withdrawn.remove(&gpu);
            }
        }
    }

    /// Revokes the lease holding `gpu`, if any.
    pub fn revoke_gpu(&mut self, gpu: GpuIndex, now: Timestamp) -> Option<Lease> {
        let revoked = self.leases.revoke_gpu(gpu, now)?;
        self.credit_ended(std::slice::from_ref(&revoked));
        Some(revoked)
    }

    /// In service: no reason to withhold it from offers.
    pub fn is_healthy(&self, gpu: GpuIndex) -> bool {
        !self.withdrawn.contains_key(&gpu)
    }

    /// Whether `reason` is one of the reasons `gpu` is out of service.
    pub fn is_withdrawn_for(&self, gpu: GpuIndex, reason: Withdrawal) -> bool {
        self.withdrawn
            .get(&gpu)
            .is_some_and(|reasons| reasons.contains(&reason))
    }

    pub fn hosts(&self) -> &HostDirectory {
        &self.hosts
    }

    /// The GPUs of host `name`, in cluster order.
    pub fn host_gpus(&self, name: &str) -> Vec<GpuIndex> {
        let Some(host) = self.hosts.get(name) else {
            return Vec::new();
        };
        self.cluster
            .gpus()
            .filter(|(_, gpu)| gpu.location.machine == host.machine)
            .map(|(index, _)| index)
            .collect()
    }

    /// The registered host `gpu` is on, if any (a simulated fleet has none).
    pub fn host_of(&self, gpu: GpuIndex) -> Option<&Host> {
        self.hosts.on_machine(self.cluster.location(gpu).machine)
    }

    /// A host registers (or registers again): new GPUs join the cluster, the host is up, the
    /// GPUs it reports are back in service unless withheld for another reason, and those it
    /// no longer reports leave service, revoking their leases. All or nothing.
    pub fn register_host(
        &mut self,
        spec: &HostSpec,
        now: Timestamp,
    ) -> Result<HostJoined, MarketError> {
        let placement = self.hosts.place(&self.cluster, spec)?;
        let mut cluster = Cluster::clone(&self.cluster);
        let added = cluster.extend(placement.new_gpus)?;
        cluster.set_machine_resources(placement.host.machine, spec.resources);
        let mut hosts = self.hosts.clone();
        hosts.insert(placement.host.clone(), &cluster)?;
        self.cluster = Arc::new(cluster);
        self.hosts = hosts;
        let reported: BTreeSet<&GpuId> = spec.gpus.iter().map(|gpu| &gpu.id).collect();
        let mut unreported = Vec::new();
        let mut revoked = Vec::new();
        for gpu in self.host_gpus(&spec.name) {
            self.set_withdrawn(gpu, Withdrawal::HostDown, false);
            let gone = !reported.contains(&self.cluster.gpu(gpu).id);
            self.set_withdrawn(gpu, Withdrawal::Unreported, gone);
            if gone {
                unreported.push(gpu);
                revoked.extend(self.revoke_gpu(gpu, now));
            }
        }
        Ok(HostJoined {
            host: placement.host,
            added,
            unreported,
            revoked,
        })
    }

    /// After a restart: a host the service recorded, whose GPUs are already in the cluster.
    pub fn restore_host(&mut self, host: Host) -> Result<(), MarketError> {
        let (name, up) = (host.name.clone(), host.up);
        self.hosts.insert(host, &self.cluster)?;
        for gpu in self.host_gpus(&name) {
            self.set_withdrawn(gpu, Withdrawal::HostDown, !up);
        }
        Ok(())
    }

    /// A host stopped heartbeating: its GPUs leave service and the leases holding them are
    /// revoked (its worker can no longer enforce them).
    pub fn host_down(&mut self, name: &str, now: Timestamp) -> Result<Vec<Lease>, MarketError> {
        self.hosts.set_up(name, false)?;
        let mut revoked = Vec::new();
        for gpu in self.host_gpus(name) {
            self.set_withdrawn(gpu, Withdrawal::HostDown, true);
            revoked.extend(self.revoke_gpu(gpu, now));
        }
        Ok(revoked)
    }

    /// A host that was down heartbeats again: its GPUs return to service unless withheld for
    /// another reason.
    pub fn host_up(&mut self, name: &str) -> Result<(), MarketError> {
        self.hosts.set_up(name, true)?;
        for gpu in self.host_gpus(name) {
            self.set_withdrawn(gpu, Withdrawal::HostDown, false);
        }
        Ok(())
    }

    /// Healthy GPUs that no active lease holds.
    pub fn free_gpus(&self) -> Vec<GpuIndex> {
        self.cluster
            .gpus()
            .map(|(index, _)| index)
            .filter(|&gpu| self.is_healthy(gpu) && !self.leases.is_leased(gpu))
            .collect()
    }

    fn held_locations(&self, app: &AppId) -> Vec<GpuLocation> {
        self.leases
            .leases_of(app)
            .flat_map(|lease| lease.gpus.iter().map(|&gpu| self.cluster.location(gpu)))
            .collect()
    }

    /// Where each active app holds GPUs, for the apps that hold any.
    fn holds(&self) -> BTreeMap<AppId, Vec<GpuLocation>> {
        self.participants
            .keys()
            .map(|app| (app.clone(), self.held_locations(app)))
            .filter(|(_, held)| !held.is_empty())
            .collect()
    }

    fn fairness_context(&self, participant: &Participant, now: Timestamp) -> FairnessContext {
        FairnessContext {
            now,
            arrival: participant.lifetime.arrival,
            cluster_seconds: participant.cluster_seconds,
            average_contention: participant
                .lifetime
                .average_contention(&self.contention, now),
            restart_pause_seconds: self.config.restart_pause.as_secs_f64(),
            speeds: self.speeds(&participant.app),
        }
    }

    /// The app's current rho: what it will reach holding what it holds now.
    pub fn current_rho(&self, id: &AppId, now: Timestamp) -> Option<RhoOld> {
        let participant = self.participants.get(id)?;
        Some(rho(
            &participant.app,
            &self.held_locations(id),
            &self.fairness_context(participant, now),
        ))
    }

    /// The GPUs `app` claims (its lease on them just ended) that are still free and healthy.
    fn live_claims(&self, app: &AppId) -> Vec<GpuIndex> {
        self.claims.get(app).map_or_else(Vec::new, |claimed| {
            claimed
                .iter()
                .copied()
                .filter(|&gpu| self.is_healthy(gpu) && !self.leases.is_leased(gpu))
                .collect()
        })
    }

    /// Every active app, worst off first.
    ///
    /// An app stands with what it holds and what it claims (the GPUs its lease just ended on),
    /// so an incumbent is ranked by the rho it had, not as if it were starving. Apps that hold
    /// or claim GPUs are ranked by that rho; a starving app (holding and claiming nothing) by
    /// [`Self::passed_over_rho`], on the same scale. Ties go to the earlier arrival, then to
    /// what the apps are, and only then to the app id.
    pub fn standings(&self, now: Timestamp) -> Vec<Standing> {
        let mut ranked: Vec<(f64, Timestamp, Standing)> = self
            .participants
            .values()
            .map(|participant| {
                let (worst_off_by, standing) = self.standing_of(participant, now);
                (worst_off_by, participant.lifetime.arrival, standing)
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(a.1.cmp(&b.1))
                .then_with(|| {
                    let app = |id: &AppId| &self.participants[id].app;
                    app(&a.2.app).cmp_content(app(&b.2.app))
                })
                .then(a.2.app.cmp(&b.2.app))
        });
        ranked.into_iter().map(|(.., standing)| standing).collect()
    }

    /// `app`'s rho at `now` as the arbiter computes it: `current`, standing on what it holds
    /// and claims (its rho in [`Self::standings`]), and `projected`, holding exactly `gpus`
    /// (`None` when that is no GPU: a starving app's rho is unbounded). For a framework that
    /// wants rho without reimplementing it (the service's `POST /v1/apps/{app}/rho`).
    pub fn rho_projection(
        &self,
        app: &AppId,
        gpus: &[GpuIndex],
        now: Timestamp,
    ) -> Result<RhoProjection, MarketError> {
        let participant = self
            .participants
            .get(app)
            .ok_or_else(|| MarketError::UnknownApp(app.clone()))?;
        if let Some(&outside) = gpus.iter().find(|gpu| gpu.get() >= self.cluster.len()) {
            return Err(MarketError::GpuOutsideCluster(outside));
        }
        let (_, standing) = self.standing_of(participant, now);
        let context = self.fairness_context(participant, now);
        let on: Vec<GpuLocation> = gpus.iter().map(|&gpu| self.cluster.location(gpu)).collect();
        Ok(RhoProjection {
            current: standing.rho,
            projected: rho(&participant.app, &on, &context),
        })
    }

    /// The value `app` is ranked by in [`Self::standings`] at `now` (the higher, the worse
    /// off): its standing's rho, or [`Self::passed_over_rho`] when it is starving.
    pub fn worst_off_by(&self, app: &AppId, now: Timestamp) -> Option<f64> {
        let participant = self.participants.get(app)?;
        Some(self.standing_of(participant, now).0)
    }

    /// An app's standing at `now` and the value it is ranked by.
    fn standing_of(&self, participant: &Participant, now: Timestamp) -> (f64, Standing) {
        let id = &participant.app.id;
        let held = self.held_locations(id);
        let mut standing_on = held.clone();
        standing_on.extend(
            self.live_claims(id)
                .into_iter()
                .map(|gpu| self.cluster.location(gpu)),
        );
        let context = self.fairness_context(participant, now);
        let standing_rho = rho(&participant.app, &standing_on, &context);
        let worst_off_by = standing_rho.map_or_else(
            || self.passed_over_rho(&participant.app, &context),
            |rho| rho.get(),
        );
        let standing = Standing {
            app: id.clone(),
            rho: standing_rho,
            unmet_demand: (participant.app.current_demand() as usize).saturating_sub(held.len()),
        };
        (worst_off_by, standing)
    }

    /// How badly off a starving app is: the best rho it can still reach if this round passes
    /// it over, its whole demand ideally placed from one lease later (a GPU leased now is
    /// free again within a lease). Its rho while it holds nothing is unbounded, which would
    /// rank every starving app, an app whose lease just ran out among them, ahead of any app
    /// that holds GPUs however late it will finish; this bound grows by 1 / T_id for every
    /// second the app waits, so short apps, whose finish-time fairness suffers most from a
    /// wait, rise fastest.
    fn passed_over_rho(&self, app: &App, context: &FairnessContext) -> f64 {
        let ideal = context.speeds.fastest_location();
        let whole_demand = vec![ideal; app.current_demand().max(1) as usize];
        rho(app, &whole_demand, context).map_or(f64::INFINITY, |rho| rho.get())
            + self.config.lease_length.as_secs_f64() / independent_finish_time(context)
    }

    /// Opens a round: offers the free GPUs to the worst ceil((1-f)*N) apps (at least one)
    /// that still want GPUs: more of them, or (on mixed types) faster ones than some they
    /// hold. `None` when there is nothing to offer or nobody to offer it to.
    pub fn open_round(&self, now: Timestamp) -> Option<RoundOffer> {
        let free = self.free_gpus();
        let standings = self.standings(now);
        let bidder_count = self.config.bidders_per_round(standings.len());
        let offered: Vec<GpuLocation> =
            free.iter().map(|&gpu| self.cluster.location(gpu)).collect();
        let wants_gpus = |standing: &Standing| {
            standing.unmet_demand > 0
                || self
                    .participants
                    .get(&standing.app)
                    .is_some_and(|participant| {
                        self.speeds(&participant.app).slower_than_best_of(
                            &self.held_locations(&standing.app),
                            offered.iter().copied(),
                        ) > 0
                    })
        };
        let bidders: Vec<AppId> = standings
            .iter()
            .filter(|standing| wants_gpus(standing))
            .take(bidder_count)
            .map(|standing| standing.app.clone())
            .collect();
        if free.is_empty() || bidders.is_empty() {
            return None;
        }
        let offer = PreparedOffer::new(Offer::from_cluster(&self.cluster, &free));
        Some(RoundOffer {
            now,
            offer,
            bidders,
            standings,
        })
    }

    /// The engine's agent: the bid `app` makes for `offer` from what its framework reported.
    pub fn agent_bid(&self, offer: &RoundOffer, app: &AppId) -> Result<AppBid, MarketError> {
        Ok(self.bid_inputs(offer, app)?.bid(&offer.offer))
    }

    /// The engine's agent's bid for every bidder of `offer`, in its order. The bids are
    /// independent of one another, so they are computed on all cores.
    pub fn agent_bids(&self, offer: &RoundOffer) -> Result<Vec<AppBid>, MarketError> {
        parallel_map(&offer.bidders, |app| self.agent_bid(offer, app))
            .into_iter()
            .collect()
    }

    /// What an agent elsewhere (the service's app agents) needs to bid for `app` on `offer`.
    pub fn bid_inputs(&self, offer: &RoundOffer, app: &AppId) -> Result<BidInputs, MarketError> {
        let participant = self
            .participants
            .get(app)
            .ok_or_else(|| MarketError::UnknownApp(app.clone()))?;
        Ok(BidInputs {
            app: participant.app.clone(),
            held: self.held_locations(app),
            claimed: self
                .live_claims(app)
                .into_iter()
                .map(|gpu| self.cluster.gpu(gpu).id.clone())
                .collect(),
            context: self.fairness_context(participant, offer.now),
            config: self.config.bids,
        })
    }

    /// The allocation phase: decides the round from `bids` (the auction, then the leftovers)
    /// and grants the leases. Fails, changing nothing, if the bids are invalid or the offer is
    /// stale.
    pub fn close_round(
        &mut self,
        round: RoundOffer,
        bids: Vec<AppBid>,
        seed: u64,
    ) -> Result<RoundOutcome, MarketError> {
        let decided = self.decide_round(round, bids, seed)?;
        self.apply_round(decided)
    }

    /// Decides a round (the auction and its leftovers) without changing the market, so that a
    /// snapshot can decide it on another thread while the market goes on; [`Self::apply_round`]
    /// then grants its leases.
    pub fn decide_round(
        &self,
        round: RoundOffer,
        bids: Vec<AppBid>,
        seed: u64,
    ) -> Result<DecidedRound, MarketError> {
        self.decide_inputs(RoundInputs {
            now: round.now,
            seed,
            offer: round.offer.offer,
            bidders: round.bidders,
            holds: BTreeMap::new(),
            claims: BTreeMap::new(),
            standings: round.standings,
            bids,
            leftover_policy: self.config.leftover_policy,
            departed: BTreeSet::new(),
        })
    }

    /// Whether an app the decision gives GPUs to has left the market since it was decided:
    /// then [`Self::redecide`] decides the round again without it, rather than abandoning
    /// the round for everyone.
    pub fn outdated_by_departure(&self, decided: &DecidedRound) -> bool {
        decided
            .decision
            .grants
            .iter()
            .any(|(app, gpus)| !gpus.is_empty() && !self.participants.contains_key(app))
    }

    /// Decides a round again on the market as it is now, with the same offer, standings,
    /// bids and seed: apps that left since are withdrawn ([`RoundInputs::departed`]).
    pub fn redecide(&self, decided: DecidedRound) -> Result<DecidedRound, MarketError> {
        self.decide_inputs(decided.inputs)
    }

    /// The decision on `inputs`' offer, standings, bids and seed, with the holdings, claims
    /// and departures of the market now.
    fn decide_inputs(&self, mut inputs: RoundInputs) -> Result<DecidedRound, MarketError> {
        self.offered_indices(&inputs.offer)?;
        inputs.claims = self.offered_claims(&inputs.offer);
        inputs.holds = self.holds();
        inputs.departed = inputs
            .standings
            .iter()
            .map(|standing| &standing.app)
            .filter(|app| !self.participants.contains_key(*app))
            .cloned()
            .collect();
        let decision = match inputs.leftover_policy {
            LeftoverPolicy::WorstFirst | LeftoverPolicy::RandomToNonBidders => {
                decide_round(&inputs)?
            }
            LeftoverPolicy::ReauctionNextWorst => decide_with(&inputs, |leftover, non_bidders| {
                self.reauction(&inputs, non_bidders, leftover)
            })?,
        };
        Ok(DecidedRound { inputs, decision })
    }

    /// Grants a decided round's leases. If, since the snapshot that decided it, an offered GPU
    /// changed hands or left service, or an app that won GPUs left the market, the round fails
    /// ([`MarketError::StaleOffer`], [`MarketError::UnknownApp`]) and nothing changes.
    pub fn apply_round(&mut self, decided: DecidedRound) -> Result<RoundOutcome, MarketError> {
        let DecidedRound { inputs, decision } = decided;
        let offered = self.offered_indices(&inputs.offer)?;
        let departed = decision
            .grants
            .iter()
            .find(|(app, gpus)| !gpus.is_empty() && !self.participants.contains_key(*app));
        if let Some((app, _)) = departed {
            return Err(MarketError::UnknownApp(app.clone()));
        }
        let leases = self.grant_leases(&decision.grants, &offered, inputs.now)?;
        self.consume_claims(offered.values().copied());
        Ok(RoundOutcome {
            now: inputs.now,
            seed: inputs.seed,
            offer: inputs.offer,
            policy: Policy::Themis,
            standings: inputs.standings,
            bidders: inputs.bidders,
            holds: inputs.holds,
            claims: inputs.claims,
            leftover_policy: inputs.leftover_policy,
            auction: Some(AuctionRecord {
                bids: inputs.bids,
                outcome: decision.auction,
            }),
            leftover_grants: decision.leftover_grants,
            leases,
            departed: inputs.departed,
        })
    }

    /// Runs a whole round under the configured policy: for Themis, opens it, lets the engine's
    /// agent bid for every bidder and closes it; for a baseline, hands the free GPUs out by the
    /// baseline's metric. `None` when there is nothing to offer or nobody wants it.
    pub fn run_round(
        &mut self,
        now: Timestamp,
        seed: u64,
    ) -> Option<Result<RoundOutcome, MarketError>> {
        if self.config.policy != Policy::Themis {
            return self.run_baseline_round(now, seed);
        }
        let round = self.open_round(now)?;
        let bids = self.agent_bids(&round);
        Some(bids.and_then(|bids| self.close_round(round, bids, seed)))
    }

    fn run_baseline_round(
        &mut self,
        now: Timestamp,
        seed: u64,
    ) -> Option<Result<RoundOutcome, MarketError>> {
        let free = self.free_gpus();
        let standings = self.standings(now);
        if free.is_empty() || standings.iter().all(|standing| standing.unmet_demand == 0) {
            return None;
        }
        let offer = Offer::from_cluster(&self.cluster, &free);
        let holds = self.holds();
        let contenders = standings
            .iter()
            .filter(|standing| standing.unmet_demand > 0)
            .map(|standing| {
                let participant = &self.participants[&standing.app];
                Contender {
                    app: &participant.app,
                    holds: holds.get(&standing.app).cloned().unwrap_or_default(),
                    unmet_demand: standing.unmet_demand,
                    attained_gpu_seconds: self.attained_gpu_seconds(participant, now),
                    fairness: self.fairness_context(participant, now),
                    rho: standing.rho,
                    lease_seconds: self.config.lease_length.as_secs_f64(),
                }
            })
            .collect();
        let view = RoundView {
            now,
            free: &offer.gpus,
            contenders,
            machines: if self.config.policy.packs_cpus_and_memory() {
                self.machine_tenants()
            } else {
                BTreeMap::new()
            },
        };
        let granted = baselines::allocate(self.config.policy, &view);
        let offered = free
            .iter()
            .map(|&gpu| (self.cluster.gpu(gpu).id.clone(), gpu))
            .collect();
        self.claims.clear();
        Some(
            self.grant_leases(&granted, &offered, now)
                .map(|leases| RoundOutcome {
                    now,
                    seed,
                    offer,
                    policy: self.config.policy,
                    standings,
                    bidders: Vec::new(),
                    holds,
                    claims: BTreeMap::new(),
                    leftover_policy: self.config.leftover_policy,
                    auction: None,
                    leftover_grants: BTreeMap::new(),
                    leases,
                    departed: BTreeSet::new(),
                }),
        )
    }

    /// Each app's claimed GPUs among those `offer` offers.
    fn offered_claims(&self, offer: &Offer) -> BTreeMap<AppId, Vec<GpuId>> {
        self.claims
            .keys()
            .map(|app| {
                let claimed: Vec<GpuId> = self
                    .live_claims(app)
                    .into_iter()
                    .map(|gpu| self.cluster.gpu(gpu).id.clone())
                    .filter(|id| offer.gpus.iter().any(|offered| &offered.id == id))
                    .collect();
                (app.clone(), claimed)
            })
            .filter(|(_, claimed)| !claimed.is_empty())
            .collect()
    }

    /// A round has offered these GPUs: the claims on them are settled.
    fn consume_claims(&mut self, offered: impl Iterator<Item = GpuIndex>) {
        let offered: BTreeSet<GpuIndex> = offered.collect();
        for claimed in self.claims.values_mut() {
            claimed.retain(|gpu| !offered.contains(gpu));
        }
        self.claims.retain(|_, claimed| !claimed.is_empty());
    }

    /// GPU-seconds the app has held: ended leases plus the running part of active ones.
    fn attained_gpu_seconds(&self, participant: &Participant, now: Timestamp) -> f64 {
        let running: f64 = self
            .leases
            .leases_of(&participant.app.id)
            .map(|lease| lease.gpu_seconds_until(now))
            .sum();
        participant.ended_gpu_seconds + running
    }

    /// Books the GPU time of leases that just ended to their apps.
    fn credit_ended(&mut self, ended: &[Lease]) {
        for lease in ended {
            if let (Some(participant), Some(ended_at)) =
                (self.participants.get_mut(&lease.app), lease.ended_at)
            {
                Arc::make_mut(participant).ended_gpu_seconds += lease.gpu_seconds_until(ended_at);
            }
        }
    }

    /// Maps the offer back to cluster GPUs, checking they are all still free.
    fn offered_indices(&self, offer: &Offer) -> Result<HashMap<GpuId, GpuIndex>, MarketError> {
        offer
            .gpus
            .iter()
            .map(|gpu| {
                let index = self
                    .cluster
                    .index_of(&gpu.id)
                    .filter(|index| !self.leases.is_leased(*index) && self.is_healthy(*index));
                index
                    .map(|index| (gpu.id.clone(), index))
                    .ok_or_else(|| MarketError::StaleOffer(gpu.id.clone()))
            })
            .collect()
    }

    /// The authors' simulator's leftover rule: auction the leftovers among the next-worst
    /// ceil((1-f)*N) non-bidders, again and again, until nothing or nobody is left. The
    /// engine's agents bid, so this cannot be replayed from a round's recorded inputs.
    fn reauction(
        &self,
        round: &RoundInputs,
        mut candidates: Vec<Recipient>,
        leftover: &mut Vec<OfferedGpu>,
    ) -> Result<Grants, MarketError> {
        let batch = self.config.bidders_per_round(round.standings.len());
        let mut granted = BTreeMap::new();
        let mut pass = 0u64;
        while !leftover.is_empty() && !candidates.is_empty() {
            pass += 1;
            let bidders: Vec<Recipient> = candidates.drain(..batch.min(candidates.len())).collect();
            let sub_round = RoundOffer {
                now: round.now,
                offer: PreparedOffer::new(Offer {
                    gpus: leftover.clone(),
                }),
                bidders: bidders
                    .iter()
                    .map(|recipient| recipient.app.clone())
                    .collect(),
                standings: Vec::new(),
            };
            let bids = self.agent_bids(&sub_round)?;
            let outcome =
                run_auction(&sub_round.offer.offer, &bids, round.seed.wrapping_add(pass))?;
            *leftover = offered_subset(&sub_round.offer.offer, &outcome.unallocated);
            merge(
                &mut granted,
                outcome
                    .allocation
                    .into_iter()
                    .filter(|(_, gpus)| !gpus.is_empty())
                    .collect(),
            );
        }
        Ok(granted)
    }

    /// One lease per app for everything it got this round. All or nothing: the grants were
    /// computed from a consistent state, so a failure here is a bug, reported as an error.
    fn grant_leases(
        &mut self,
        granted: &Grants,
        offered: &HashMap<GpuId, GpuIndex>,
        now: Timestamp,
    ) -> Result<Vec<Lease>, MarketError> {
        let mut book = self.leases.clone();
        let mut ids = Vec::with_capacity(granted.len());
        for (app, gpus) in granted.iter().filter(|(_, gpus)| !gpus.is_empty()) {
            let indices = gpus.iter().map(|gpu| offered[gpu]).collect();
            ids.push(book.grant(app.clone(), indices, now, self.config.lease_length)?);
        }
        self.leases = book;
        self.divide_resources();
        Ok(ids
            .into_iter()
            .filter_map(|id| self.leases.get(id).cloned())
            .collect())
    }
}
