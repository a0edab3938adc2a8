//! `agora serve`: the arbiter service (HTTP API, actors, Postgres), optionally with a demo.

use std::path::PathBuf;
use std::sync::Arc;

use agora_server::clock::SystemClock;
use agora_server::config::ServerConfig;
use agora_server::demo::DemoOptions;
use anyhow::Context as _;
use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML settings (every setting has a default; DATABASE_URL, AGORA_LISTEN,
    /// AGORA_ADVERTISE_URL, AGORA_ADMIN_TOKEN, AGORA_ADMIN_TOKEN_FILE, AGORA_FLEET,
    /// AGORA_LEASE_SECONDS, AGORA_GPUS and AGORA_WORKER_TOKEN override the file).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also run a living demo: synthetic HPO apps from four tenants keep arriving and bid
    /// through the HTTP API, on short leases, so live rounds with several bidders never stop.
    #[arg(long)]
    demo: bool,
    /// The demo's seed: the same seed gives the same stream of arrivals.
    #[arg(long, value_name = "SEED", requires = "demo", default_value_t = DemoOptions::DEFAULT_SEED)]
    demo_seed: u64,
    /// The demo's mean arrivals per minute, in (0, 600].
    #[arg(long, value_name = "ARRIVALS_PER_MINUTE", requires = "demo",
          default_value_t = DemoOptions::DEFAULT_RATE, value_parser = demo_rate)]
    demo_rate: f64,
}

/// `--demo-rate`: a number within what [`DemoOptions::new`] takes.
fn demo_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .parse()
        .map_err(|_| format!("expected a number of arrivals per minute, got {text:?}"))?;
    DemoOptions::new(DemoOptions::DEFAULT_SEED, rate).map(|options| options.rate_per_minute)
}

impl ServeArgs {
    pub fn run(self) -> anyhow::Result<()> {
        // Dropped after the runtime stops, so what the exporters still hold is sent.
        let _telemetry = agora_server::telemetry::init();
        let mut config =
            ServerConfig::load(self.config.as_deref(), |name| std::env::var(name).ok())?;
        if self.demo {
            agora_server::demo::adjust(&mut config)?;
        }
        actix_web::rt::System::new().block_on(async move {
            let clock = Arc::new(SystemClock);
            let mut running = agora_server::server::start(&config, clock.clone()).await?;
            if self.demo {
                let options = DemoOptions::new(self.demo_seed, self.demo_rate)
                    .map_err(|message| anyhow::anyhow!(message))?;
                let tokens_file = std::path::Path::new(agora_server::demo::DEMO_TENANT_TOKENS_FILE);
                agora_server::demo::start(&running, &config, clock, options, tokens_file).await?;
            }
            tokio::select! {
                signal = shutdown_signal() => signal?,
                reason = running.failed() => {
                    running.stop().await;
                    anyhow::bail!(
                        "the arbiter stopped: {reason}. Check Postgres, then start `agora serve` \
                         again: it restores its state from the database (or stands by, if \
                         another arbiter of the database leads)"
                    );
                }
            }
            tracing::info!("shutting down: finishing requests in flight");
            running.stop().await;
            Ok(())
        })
    }
}

/// Waits for Ctrl-C or SIGTERM.
pub(super) async fn shutdown_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("cannot listen for Ctrl-C"),
        _ = terminate.recv() => Ok(()),
    }
}
