//! `agora serve --demo`: a market that lives. Four demo tenants' HPO frameworks, played
//! through the real HTTP API, keep a contended market going indefinitely: apps arrive in a
//! seeded stream (single training jobs and successive-halving searches, some bidding
//! explicitly), demand stays above twice the cluster, apps finish and others starve for a
//! while. Leases are short, so a newcomer sees live rounds within seconds. The log names the
//! dashboard's address and each demo tenant's token, to sign in with.

mod driver;
mod http;
mod plan;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};

pub use driver::Demo;
pub use plan::DemoOptions;
use plan::TENANTS;

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::server::Running;

/// How often `agora serve --demo` steps the demo (wall time: it paces, never decides).
const STEP_EVERY: Duration = Duration::from_millis(500);

/// Where the demo keeps its tenants' tokens, so that a restart on the same database goes on as
/// the same tenants.
pub const DEMO_TENANT_TOKENS_FILE: &str = ".agora/demo-tenant-tokens";

/// Where the demo keeps the admin token it made, when none was configured: the same token at
/// every start, so a dashboard signed in as admin stays signed in across restarts.
pub const DEMO_ADMIN_TOKEN_FILE: &str = ".agora/demo-admin-token";

/// Where the demo's admin token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DemoAdmin {
    /// `admin_token`, `AGORA_ADMIN_TOKEN` or `admin_token_file` set it.
    Configured,
    /// Made by an earlier demo start and read back from this file.
    Reused(PathBuf),
    /// Made now and kept in this file (readable by its owner only).
    Created(PathBuf),
}

/// Demo settings: short leases and deadlines, and an admin token if none was configured (the
/// one in [`DEMO_ADMIN_TOKEN_FILE`], made at the first start). Says what it did in the log.
pub fn adjust(config: &mut ServerConfig) -> anyhow::Result<DemoAdmin> {
    let admin = adjust_with(config, Path::new(DEMO_ADMIN_TOKEN_FILE))?;
    match &admin {
        DemoAdmin::Configured => tracing::info!("demo uses the configured admin token"),
        DemoAdmin::Reused(path) => tracing::info!(
            file = %path.display(),
            "demo reuses the admin token it made at an earlier start"
        ),
        DemoAdmin::Created(path) => tracing::info!(
            file = %path.display(),
            "demo made an admin token and keeps it for the next starts"
        ),
    }
    Ok(admin)
}

/// [`adjust`], keeping a made admin token in `token_file`.
pub fn adjust_with(config: &mut ServerConfig, token_file: &Path) -> anyhow::Result<DemoAdmin> {
    if config.lease_seconds == ServerConfig::default().lease_seconds {
        config.lease_seconds = 10;
    }
    config.round_deadline_ms = config.round_deadline_ms.min(1_000);
    if config.admin_token.is_some() {
        return Ok(DemoAdmin::Configured);
    }
    if let Ok(text) = std::fs::read_to_string(token_file) {
        let token = text.trim();
        if !token.is_empty() {
            config.admin_token = Some(token.to_owned());
            return Ok(DemoAdmin::Reused(token_file.to_owned()));
        }
    }
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).context("the operating system provides no randomness")?;
    let token = format!("demo-admin-{}", hex::encode(bytes));
    if let Some(directory) = token_file
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
    {
        std::fs::create_dir_all(directory)
            .with_context(|| format!("cannot create {}", directory.display()))?;
    }
    write_private(token_file, &token).with_context(|| {
        format!(
            "cannot keep the demo admin token in {}",
            token_file.display()
        )
    })?;
    config.admin_token = Some(token);
    Ok(DemoAdmin::Created(token_file.to_owned()))
}

/// Writes `text` to a new file only its owner may read.
pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")
}

/// Creates the demo's tenants (keeping their tokens in `tokens_file`, usually
/// [`DEMO_TENANT_TOKENS_FILE`]), registers the first apps, and steps the demo in the background
/// for as long as the service runs.
pub async fn start(
    running: &Running,
    config: &ServerConfig,
    clock: Arc<dyn Clock>,
    options: DemoOptions,
    tokens_file: &Path,
) -> anyhow::Result<()> {
    let base = format!("http://{}", running.address);
    let admin = config
        .admin_token
        .clone()
        .ok_or_else(|| anyhow!("the demo needs an admin token"))?;
    if let Some(directory) = tokens_file
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
    {
        std::fs::create_dir_all(directory)
            .with_context(|| format!("cannot create {}", directory.display()))?;
    }
    let mut demo = Demo::new(
        base.clone(),
        admin.clone(),
        clock,
        options,
        Some(tokens_file),
    )
    .await?;
    demo.step().await;
    let dashboard = format!("{base}/");
    tracing::info!(
        %dashboard,
        admin_token = %admin,
        seed = options.seed,
        rate_per_minute = options.rate_per_minute,
        apps = demo.live_apps(),
        "demo running: tenants {}; apps keep arriving; open the dashboard and sign in with a token",
        TENANTS.join(", ")
    );
    actix_web::rt::spawn(async move {
        loop {
            actix_web::rt::time::sleep(STEP_EVERY).await;
            demo.step().await;
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_admin_token_is_made_once_and_reused_at_every_start() {
        let directory = std::env::temp_dir().join(format!("agora-demo-{}", std::process::id()));
        let file = directory.join("admin-token");
        let _ = std::fs::remove_dir_all(&directory);
        let mut first = ServerConfig::default();
        assert_eq!(
            adjust_with(&mut first, &file).expect("made"),
            DemoAdmin::Created(file.clone())
        );
        let mut second = ServerConfig::default();
        assert_eq!(
            adjust_with(&mut second, &file).expect("read back"),
            DemoAdmin::Reused(file.clone())
        );
        assert!(first.admin_token.is_some());
        assert_eq!(second.admin_token, first.admin_token, "the same token");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).expect("kept").permissions().mode();
        assert_eq!(mode & 0o077, 0, "readable by its owner only");
        let mut configured = ServerConfig {
            admin_token: Some("operator-set".to_owned()),
            ..ServerConfig::default()
        };
        assert_eq!(
            adjust_with(&mut configured, &file).expect("configured"),
            DemoAdmin::Configured
        );
        assert_eq!(configured.admin_token.as_deref(), Some("operator-set"));
        std::fs::remove_dir_all(&directory).expect("clean up");
    }
}
