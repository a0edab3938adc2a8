//! Starting the service: the database, the HTTP server, and the lead: when this arbiter holds
//! the leader's lock (at once, or later as a standby), the GPUs (a simulated fleet or the
//! registered hosts), the arbiter's state as the database last recorded it, and the actors.
//! Must run inside the actix runtime.

use std::net::SocketAddr;
use std::sync::Arc;

use actix::Actor;
use actix_web::dev::ServerHandle;
use actix_web::{web, App as HttpApp, HttpServer};
use agora_market::app::{App, AppId, AppKind};
use agora_market::auction::{AppBid, BidEntry, Offer};
use agora_market::bids::PreparedOffer;
use agora_market::cluster_file::{parse_cluster, ClusterFileError};
use agora_market::hosts::Host;
use agora_market::lease::{Lease, LeaseId, LeaseState};
use agora_market::market::{Market, RecordedApp, RoundOffer, Standing, Withdrawal};
use agora_market::resources::MachineResources;
use agora_market::rho::Rho;
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, Gpu, GpuId, GpuIndex, GpuLocation};
use agora_protocol::Enforcement;
use anyhow::{anyhow, Context as _};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::actors::agent::Bidding;
use crate::actors::arbiter::{Arbiter, ArbiterSettings, ReopenedRound, Restored};
use crate::api::{self, ApiState};
use crate::clock::{from_datetime, Clock};
use crate::config::{GpuSource, ServerConfig};
use crate::ids::LeaseKey;
use crate::leadership::{LeaderLock, Leadership};
use crate::notices::Notices;
use crate::store::{Store, StoredBid, StoredHost, StoredRound, StoredWorkerGpu};

/// A started service: leading, or a standby waiting to take over.
#[derive(Debug)]
pub struct Running {
    /// Where it listens (the real port when the config asked for port 0).
    pub address: SocketAddr,
    pub http: ServerHandle,
    pub store: Store,
    pub leadership: Leadership,
    /// The bearer tokens the API remembers.
    pub tokens: Arc<api::Tokens>,
    /// Why this arbiter must stop: its decision refused by the database, its lead lost, or its
    /// takeover failed.
    failures: mpsc::UnboundedReceiver<String>,
    /// Waits for the leader's lock (a standby), then leads while holding it.
    succession: JoinHandle<()>,
    /// Listens to token changes for the API's token memory.
    token_changes: JoinHandle<()>,
    /// Cancels auditors' statements that run too long.
    auditor_watch: JoinHandle<()>,
}

impl Running {
    /// Stops taking requests, finishes the ones in flight, stops the arbiter, waits until every
    /// decision it made is written, and only then lets the lock go to a standby.
    pub async fn stop(&self) {
        self.http.stop(true).await;
        self.token_changes.abort();
        self.auditor_watch.abort();
        if let Some(arbiter) = self.leadership.arbiter() {
            // Returns once the arbiter has stopped and its decisions are written; an arbiter
            // that already stopped on its own has nothing left to write.
            let _ = arbiter.send(crate::actors::Shutdown).await;
        }
        self.succession.abort();
    }

    /// Why the arbiter must stop (a decision the database refused, its lead lost); never
    /// returns if it need not.
    pub async fn failed(&mut self) -> String {
        match self.failures.recv().await {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

/// Starts everything; the HTTP server runs in the background until [`Running::stop`]. Returns
/// leading when no other arbiter of the database leads, and as a standby otherwise (it takes
/// over in the background when the leader's lock is released).
pub async fn start(config: &ServerConfig, clock: Arc<dyn Clock>) -> anyhow::Result<Running> {
    let store = Store::connect(&config.database_url).await?;
    let notices = Arc::new(Notices::default());
    let leadership = Leadership::default();
    let state = ApiState {
        store: store.clone(),
        leadership: leadership.clone(),
        admin_token_sha256: config.admin_token.as_deref().map(api::token_sha256),
        worker_token_sha256: config.accepted_worker_token().map(api::token_sha256),
        notices: notices.clone(),
        owners: Arc::default(),
        tokens: Arc::default(),
        clock: clock.clone(),
    };
    let tokens = state.tokens.clone();
    let token_changes = actix_web::rt::spawn(tokens.clone().follow_changes(store.clone()));
    let auditor_watch = actix_web::rt::spawn(watch_auditors(
        store.clone(),
        config.auditor_statement_timeout(),
    ));
    let (address, http) = serve_http(config, state)?;
    let (failed, failures) = mpsc::unbounded_channel();
    let candidate = Candidate {
        config: config.clone(),
        url: config.advertise_url(address),
        clock,
        store: store.clone(),
        notices,
        leadership: leadership.clone(),
        failed,
    };
    let mut lock = LeaderLock::connect(&config.database_url).await?;
    let succession = if lock.try_acquire().await? {
        let held = candidate.take_over(lock).await?;
        actix_web::rt::spawn(candidate.keep_leading(held))
    } else {
        tracing::info!(%address, "agora arbiter is a standby: another arbiter leads");
        drop(lock);
        actix_web::rt::spawn(candidate.stand_by())
    };
    Ok(Running {
        address,
        http,
        store,
        leadership,
        tokens,
        failures,
        succession,
        token_changes,
        auditor_watch,
    })
}

/// Binds and runs the HTTP server in the background.
fn serve_http(
    config: &ServerConfig,
    state: ApiState,
) -> anyhow::Result<(SocketAddr, ServerHandle)> {
    let http = HttpServer::new(move || {
        HttpApp::new()
            .app_data(web::Data::new(state.clone()))
            .wrap(actix_web::middleware::from_fn(api::turn_writes_away))
            .wrap(actix_web::middleware::Logger::new("%r %s %Dms").log_target("agora::http"))
            .wrap(actix_web::middleware::from_fn(
                crate::telemetry::trace_request,
            ))
            .configure(api::configure)
    })
    .workers(2)
    // Event streams never finish by themselves: give them a few seconds, not actix's 30.
    .shutdown_timeout(5)
    .disable_signals()
    .bind(&config.listen)
    .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = *http
        .addrs()
        .first()
        .ok_or_else(|| anyhow!("bound to no address"))?;
    let server = http.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    tracing::info!(%address, "agora arbiter listening");
    Ok((address, handle))
}

/// What an arbiter needs to take the lead.
struct Candidate {
    config: ServerConfig,
    /// This arbiter's URL, recorded for standbys to name.
    url: String,
    clock: Arc<dyn Clock>,
    store: Store,
    notices: Arc<Notices>,
    leadership: Leadership,
    failed: mpsc::UnboundedSender<String>,
}

/// The leader's lock, and the arbiter's own failure.
struct Held {
    lock: LeaderLock,
    arbiter_failure: oneshot::Receiver<String>,
}

impl Candidate {
    /// Waits for the leader's lock (again after any error: Postgres away, a connection lost),
    /// then takes over and leads.
    async fn stand_by(self) {
        let lock = loop {
            match self.wait_for_lock().await {
                Ok(lock) => break lock,
                Err(error) => {
                    tracing::warn!(%error, "standby cannot wait for the leader's lock; retrying in 1 s");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        };
        match self.take_over(lock).await {
            Ok(held) => self.keep_leading(held).await,
            Err(error) => {
                let _ = self
                    .failed
                    .send(format!("cannot take over as leader: {error:#}"));
            }
        }
    }

    async fn wait_for_lock(&self) -> Result<LeaderLock, crate::store::StoreError> {
        let mut lock = LeaderLock::connect(&self.config.database_url).await?;
        lock.acquire().await?;
        Ok(lock)
    }

    /// With the lock held: claims the next fencing epoch, restores every app, lease and open
    /// round from the database (after the epoch, so nothing the previous leader commits can be
    /// missed) and starts the arbiter.
    async fn take_over(&self, mut lock: LeaderLock) -> anyhow::Result<Held> {
        let started = std::time::Instant::now();
        let epoch = lock.claim(&self.url).await?;
        self.store.lead(epoch);
        let config = &self.config;
        let cluster = load_cluster(config, &self.store).await?;
        let restored = restore(&self.store, cluster, config, self.clock.now()).await?;
        let settings = ArbiterSettings {
            round_deadline: config.round_deadline(),
            revocation_grace: config.revocation_grace(),
            tick: config.tick(),
            heartbeat_interval: config.heartbeat_interval(),
        };
        let mut arbiter = Arbiter::new(
            restored,
            self.store.clone(),
            self.clock.clone(),
            settings,
            self.notices.clone(),
        );
        let arbiter_failure = arbiter.failure();
        self.leadership.lead(arbiter.start());
        tracing::info!(
            epoch,
            url = %self.url,
            took_ms = started.elapsed().as_millis() as u64,
            "agora arbiter leads"
        );
        Ok(Held {
            lock,
            arbiter_failure,
        })
    }

    /// Holds the lock until [`Running::stop`]; reports the arbiter's failure or the lock's
    /// loss (after which the fencing epoch refuses every write this arbiter tries).
    async fn keep_leading(self, mut held: Held) {
        let reason = tokio::select! {
            reason = held.lock.lost() => reason,
            reason = &mut held.arbiter_failure => match reason {
                Ok(reason) => reason,
                Err(_) => std::future::pending().await,
            },
        };
        let _ = self.failed.send(reason);
        // The lock goes when the service stops, after the arbiter wrote what it could.
        std::future::pending::<()>().await;
    }
}

/// The GPUs: the simulated fleet (recorded in the database) or the registered hosts.
async fn load_cluster(config: &ServerConfig, store: &Store) -> anyhow::Result<Cluster> {
    match config.gpus {
        GpuSource::Simulated => {
            let context = "the simulated fleet (`fleet` in the config, or AGORA_FLEET)";
            let text = std::fs::read_to_string(&config.fleet)
                .map_err(|source| ClusterFileError::Io {
                    path: config.fleet.clone(),
                    source,
                })
                .context(context)?;
            let cluster = parse_cluster(&text, &config.fleet).context(context)?;
            store.sync_fleet(&cluster).await?;
            Ok(cluster)
        }
        GpuSource::Workers => {
            worker_cluster(&store.worker_gpus().await?, &store.worker_hosts().await?)
        }
    }
}

/// Enforces the auditors' statement timeout: a few times per `limit`, cancels their
/// statements that have run longer. Real time, as Postgres measures statements.
async fn watch_auditors(store: Store, limit: std::time::Duration) {
    let period = (limit / 4).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(5),
    );
    let mut ticks = tokio::time::interval(period);
    loop {
        ticks.tick().await;
        match store.cancel_overlong_auditor_statements(limit).await {
            Ok(0) => {}
            Ok(cancelled) => {
                tracing::warn!(cancelled, "auditor statements over their time cancelled")
            }
            Err(error) => tracing::warn!(%error, "cannot check the auditors' statements"),
        }
    }
}

/// The engine's state as the database recorded it: GPU hosts, active apps, active leases,
/// GPUs out of service, and the round that was open, if any.
async fn restore(
    store: &Store,
    cluster: Cluster,
    config: &ServerConfig,
    now: Timestamp,
) -> anyhow::Result<Restored> {
    let mut market = Market::new(cluster, config.market(), now)?;
    if config.gpus == GpuSource::Workers {
        restore_hosts(store, &mut market).await?;
    }
    let mut members = Vec::new();
    let mut apps = Vec::new();
    for app in store.active_apps().await? {
        let kind: AppKind = serde_json::from_value(app.state)
            .with_context(|| format!("stored state of app {}", app.id))?;
        let id = AppId::from(app.id);
        let bidding = Bidding::parse(&app.bidding)
            .ok_or_else(|| anyhow!("app {}: unknown bidding mode {}", app.id, app.bidding))?;
        let enforcement: Enforcement = serde_json::from_value(app.enforcement)
            .with_context(|| format!("stored enforcement of app {}", app.id))?;
        let app_state = App {
            id: id.clone(),
            kind,
        };
        let recorded = RecordedApp {
            arrival: from_datetime(app.arrived_at),
            cluster_seconds: app
                .cluster_seconds
                .unwrap_or_else(|| market.cluster_time(&app_state)),
            ended_gpu_seconds: app.ended_gpu_seconds,
        };
        apps.push((app_state, recorded));
        members.push((id, app.tenant_id, bidding, enforcement));
    }
    let departed: Vec<(Timestamp, Timestamp)> = store
        .departed_apps()
        .await?
        .into_iter()
        .map(|app| {
            (
                from_datetime(app.arrived_at),
                from_datetime(app.finished_at),
            )
        })
        .collect();
    market.restore_apps(apps, &departed, now)?;
    for lease in store.active_leases().await? {
        let gpus = gpu_indices(market.cluster(), &lease.gpus)?;
        market.restore_lease(Lease {
            id: engine_lease_id(lease.id)?,
            app: lease.app_id.into(),
            gpus,
            start: from_datetime(lease.start_at),
            end: from_datetime(lease.end_at),
            state: LeaseState::Active,
            ended_at: None,
        })?;
    }
    market.restore_resource_split();
    for lease in store.claimed_leases().await? {
        let gpus = gpu_indices(market.cluster(), &lease.gpus)?;
        market.restore_claim(lease.app_id.into(), gpus)?;
    }
    for gpu in gpu_indices(market.cluster(), &store.unhealthy_gpus().await?)? {
        market.set_withdrawn(gpu, Withdrawal::Drained, true);
    }
    let (next_round, next_lease) = store.next_ids().await?;
    market.issue_lease_ids_from(engine_lease_id(next_lease)?);
    let round = match store.open_round_id().await? {
        Some(id) => {
            let stored = store
                .stored_round(id)
                .await?
                .ok_or_else(|| anyhow!("round {id} vanished"))?;
            Some(reopen(stored)?)
        }
        None => None,
    };
    tracing::info!(
        apps = members.len(),
        leases = market.leases().active().count(),
        reopened_round = round.as_ref().map(|round| round.id),
        "state restored"
    );
    Ok(Restored {
        market,
        members,
        round,
        next_round: next_round.0,
    })
}

fn engine_lease_id(lease: LeaseKey) -> anyhow::Result<LeaseId> {
    lease
        .lease_id()
        .ok_or_else(|| anyhow!("lease id {lease} in the database is negative"))
}

/// The cluster the registered GPU hosts form, as stored, with the CPUs and memory they
/// reported.
fn worker_cluster(gpus: &[StoredWorkerGpu], hosts: &[StoredHost]) -> anyhow::Result<Cluster> {
    let gpus = gpus
        .iter()
        .map(|gpu| Gpu {
            id: gpu.gpu_id.clone(),
            gpu_type: gpu.gpu_type.clone(),
            location: GpuLocation {
                rack: gpu.rack as u32,
                machine: gpu.machine_id as u32,
                slot: gpu.slot as u32,
            },
        })
        .collect();
    let mut cluster = Cluster::new(gpus).context("the GPU hosts stored in the database")?;
    for host in hosts {
        let resources = MachineResources {
            cpus: host.cpus.map(f64::from),
            memory_gib: host.memory_gib,
        };
        cluster.set_machine_resources(host.machine_id as u32, resources);
    }
    Ok(cluster)
}

/// The registered GPU hosts: which are up, how their slots map onto the cluster's, and which
/// of their GPUs are out of service.
async fn restore_hosts(store: &Store, market: &mut Market) -> anyhow::Result<()> {
    let gpus = store.worker_gpus().await?;
    for host in store.worker_hosts().await? {
        let slots = gpus
            .iter()
            .filter(|gpu| gpu.machine_id == host.machine_id)
            .map(|gpu| (gpu.host_slot as u32, gpu.slot as u32))
            .collect();
        let restored = Host::restored(
            host.name,
            host.rack_name,
            host.machine_id as u32,
            slots,
            host.status == "up",
        );
        market.restore_host(restored)?;
    }
    for gpu in &gpus {
        let index = market
            .cluster()
            .index_of(&gpu.gpu_id)
            .ok_or_else(|| anyhow!("GPU {} of a stored host is not in the cluster", gpu.gpu_id))?;
        market.set_withdrawn(index, Withdrawal::Unhealthy, !gpu.healthy);
        market.set_withdrawn(index, Withdrawal::Unreported, !gpu.reported);
    }
    Ok(())
}

fn gpu_indices(cluster: &Cluster, ids: &[GpuId]) -> anyhow::Result<Vec<GpuIndex>> {
    ids.iter()
        .map(|id| {
            cluster.index_of(id).ok_or_else(|| {
                anyhow!("GPU {id} is in the database but not in the fleet; restore the fleet file")
            })
        })
        .collect()
}

/// A round that was open when the arbiter stopped, with the bids frameworks had posted: it
/// goes on to its deadline, so no acknowledged bid is lost.
fn reopen(stored: StoredRound) -> anyhow::Result<ReopenedRound> {
    let offer: Offer = serde_json::from_value(stored.offer)?;
    let standings: Vec<Standing> = serde_json::from_value(stored.standings)?;
    let seed = stored.seed.parse().context("stored seed")?;
    let bids = stored
        .bids
        .iter()
        .map(|bid| Ok((bid.app_id.into(), app_bid(bid)?)))
        .collect::<anyhow::Result<_>>()?;
    let round = RoundOffer {
        now: from_datetime(stored.opened_at),
        offer: PreparedOffer::new(offer),
        bidders: stored.bidders.iter().map(|&app| app.into()).collect(),
        standings,
    };
    Ok(ReopenedRound {
        id: stored.id.0,
        seed,
        deadline: from_datetime(stored.deadline),
        offer: round,
        framework_bids: bids,
    })
}

/// A stored bid as the engine's bid.
pub fn app_bid(bid: &StoredBid) -> anyhow::Result<AppBid> {
    Ok(AppBid {
        app: bid.app_id.into(),
        rho_old: bid.rho_old.map(Rho::new).transpose()?,
        bids: bid
            .entries
            .iter()
            .map(|(gpus, rho)| {
                Ok(BidEntry {
                    gpus: gpus.clone(),
                    rho: Rho::new(*rho)?,
                })
            })
            .collect::<anyhow::Result<_>>()?,
    })
}
