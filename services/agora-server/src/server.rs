//! Starting the service: the database, the GPUs (a simulated fleet or the registered hosts),
//! the arbiter's state as the database last recorded it, the actors, and the HTTP server. Must
//! run inside the actix runtime.

use std::net::SocketAddr;
use std::sync::Arc;

use actix::{Actor, Addr};
use actix_web::dev::ServerHandle;
use actix_web::{web, App as HttpApp, HttpServer};
use agora_market::app::{App, AppKind};
use agora_market::auction::{AppBid, BidEntry, Offer};
use agora_market::bids::PreparedOffer;
use agora_market::cluster_file::{parse_cluster, ClusterFileError};
use agora_market::hosts::Host;
use agora_market::lease::{Lease, LeaseId, LeaseState};
use agora_market::market::{Market, RecordedApp, RoundOffer, Standing, Withdrawal};
use agora_market::rho::Rho;
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, Gpu, GpuId, GpuIndex, GpuLocation};
use agora_protocol::Enforcement;
use anyhow::{anyhow, Context as _};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::actors::agent::Bidding;
use crate::actors::arbiter::{Arbiter, ArbiterSettings, ReopenedRound, Restored};
use crate::api::{self, ApiState};
use crate::clock::{from_datetime, Clock};
use crate::config::{GpuSource, ServerConfig};
use crate::notices::Notices;
use crate::store::{app_id, Store, StoredBid, StoredRound, StoredWorkerGpu};

/// A started service.
#[derive(Debug)]
pub struct Running {
    /// Where it listens (the real port when the config asked for port 0).
    pub address: SocketAddr,
    pub http: ServerHandle,
    pub arbiter: Addr<Arbiter>,
    pub store: Store,
    failure: oneshot::Receiver<String>,
    /// Listens to token changes for the API's token memory.
    token_changes: JoinHandle<()>,
    /// Cancels auditors' statements that run too long.
    auditor_watch: JoinHandle<()>,
}

impl Running {
    /// Stops taking requests, finishes the ones in flight, stops the arbiter and waits until
    /// every decision it made is written.
    pub async fn stop(&self) {
        self.http.stop(true).await;
        self.token_changes.abort();
        self.auditor_watch.abort();
        // Returns once the arbiter has stopped and its decisions are written; an arbiter that
        // already stopped on its own has nothing left to write.
        let _ = self.arbiter.send(crate::actors::Shutdown).await;
    }

    /// Why the arbiter stopped on its own (a decision the database refused); never returns if
    /// it does not.
    pub async fn failed(&mut self) -> String {
        match (&mut self.failure).await {
            Ok(reason) => reason,
            Err(_) => std::future::pending().await,
        }
    }
}

/// Starts everything; the HTTP server runs in the background until [`Running::stop`].
pub async fn start(config: &ServerConfig, clock: Arc<dyn Clock>) -> anyhow::Result<Running> {
    let store = Store::connect(&config.database_url).await?;
    let cluster = match config.gpus {
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
            cluster
        }
        GpuSource::Workers => worker_cluster(&store.worker_gpus().await?)?,
    };
    let restored = restore(&store, cluster, config, clock.now()).await?;
    let notices = Arc::new(Notices::default());
    let settings = ArbiterSettings {
        round_deadline: config.round_deadline(),
        revocation_grace: config.revocation_grace(),
        tick: config.tick(),
        heartbeat_interval: config.heartbeat_interval(),
    };
    let mut arbiter = Arbiter::new(
        restored,
        store.clone(),
        clock.clone(),
        settings,
        notices.clone(),
    );
    let failure = arbiter.failure();
    let arbiter = arbiter.start();
    let state = ApiState {
        store: store.clone(),
        arbiter: arbiter.clone(),
        admin_token_sha256: config.admin_token.as_deref().map(api::token_sha256),
        worker_token_sha256: config.accepted_worker_token().map(api::token_sha256),
        notices,
        owners: Arc::default(),
        tokens: Arc::default(),
        clock,
    };
    let token_changes = actix_web::rt::spawn(state.tokens.clone().follow_changes(store.clone()));
    let auditor_watch = actix_web::rt::spawn(watch_auditors(
        store.clone(),
        config.auditor_statement_timeout(),
    ));
    let http = HttpServer::new(move || {
        HttpApp::new()
            .app_data(web::Data::new(state.clone()))
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
    Ok(Running {
        address,
        http: handle,
        arbiter,
        store,
        failure,
        token_changes,
        auditor_watch,
    })
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
        let id = app_id(app.id);
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
            id: LeaseId(lease.id as u64),
            app: app_id(lease.app_id),
            gpus,
            start: from_datetime(lease.start_at),
            end: from_datetime(lease.end_at),
            state: LeaseState::Active,
            ended_at: None,
        })?;
    }
    for lease in store.claimed_leases().await? {
        let gpus = gpu_indices(market.cluster(), &lease.gpus)?;
        market.restore_claim(app_id(lease.app_id), gpus)?;
    }
    for gpu in gpu_indices(market.cluster(), &store.unhealthy_gpus().await?)? {
        market.set_withdrawn(gpu, Withdrawal::Drained, true);
    }
    let (next_round, next_lease) = store.next_ids().await?;
    market.issue_lease_ids_from(LeaseId(next_lease as u64));
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
        next_round,
    })
}

/// The cluster the registered GPU hosts form, as stored.
fn worker_cluster(gpus: &[StoredWorkerGpu]) -> anyhow::Result<Cluster> {
    let gpus = gpus
        .iter()
        .map(|gpu| Gpu {
            id: GpuId(gpu.gpu_id.clone()),
            gpu_type: gpu.gpu_type.clone(),
            location: GpuLocation {
                rack: gpu.rack as u32,
                machine: gpu.machine_id as u32,
                slot: gpu.slot as u32,
            },
        })
        .collect();
    Cluster::new(gpus).context("the GPU hosts stored in the database")
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
            .index_of(&GpuId(gpu.gpu_id.clone()))
            .ok_or_else(|| anyhow!("GPU {} of a stored host is not in the cluster", gpu.gpu_id))?;
        market.set_withdrawn(index, Withdrawal::Unhealthy, !gpu.healthy);
        market.set_withdrawn(index, Withdrawal::Unreported, !gpu.reported);
    }
    Ok(())
}

fn gpu_indices(cluster: &Cluster, ids: &[String]) -> anyhow::Result<Vec<GpuIndex>> {
    ids.iter()
        .map(|id| {
            cluster.index_of(&GpuId(id.clone())).ok_or_else(|| {
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
        .map(|bid| Ok((app_id(bid.app_id), app_bid(bid)?)))
        .collect::<anyhow::Result<_>>()?;
    let round = RoundOffer {
        now: from_datetime(stored.opened_at),
        offer: PreparedOffer::new(offer),
        bidders: stored.bidders.iter().map(|&app| app_id(app)).collect(),
        standings,
    };
    Ok(ReopenedRound {
        id: stored.id,
        seed,
        deadline: from_datetime(stored.deadline),
        offer: round,
        framework_bids: bids,
    })
}

/// A stored bid as the engine's bid.
pub fn app_bid(bid: &StoredBid) -> anyhow::Result<AppBid> {
    Ok(AppBid {
        app: app_id(bid.app_id),
        rho_old: bid.rho_old.map(Rho::new).transpose()?,
        bids: bid
            .entries
            .iter()
            .map(|(gpus, rho)| {
                Ok(BidEntry {
                    gpus: gpus.iter().cloned().map(GpuId).collect(),
                    rho: Rho::new(*rho)?,
                })
            })
            .collect::<anyhow::Result<_>>()?,
    })
}
