//! `agora serve --demo`: two tenants and six synthetic HPO apps driven through the real HTTP
//! API (register, follow events by long-poll, bid explicitly for some, report progress), on
//! short leases, so a newcomer sees live rounds within seconds. The log names the dashboard's
//! address and each demo tenant's token, to sign in with.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use serde_json::{json, Value};

use crate::config::ServerConfig;
use crate::server::Running;

/// Time between two demo apps' arrivals.
const ARRIVAL_GAP: Duration = Duration::from_millis(300);

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
        config.lease_seconds = 20;
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
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
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

/// One synthetic app: its shape and how it bids.
struct DemoApp {
    name: &'static str,
    explicit: bool,
    jobs: u32,
    max_gpus: u32,
    iterations: u64,
    serial_iteration_time: f64,
}

const APPS: [DemoApp; 6] = [
    DemoApp {
        name: "resnet-sweep",
        explicit: false,
        jobs: 4,
        max_gpus: 2,
        iterations: 4_000,
        serial_iteration_time: 0.4,
    },
    DemoApp {
        name: "bert-finetune",
        explicit: true,
        jobs: 2,
        max_gpus: 4,
        iterations: 3_000,
        serial_iteration_time: 0.8,
    },
    DemoApp {
        name: "vit-hyperband",
        explicit: false,
        jobs: 6,
        max_gpus: 1,
        iterations: 2_000,
        serial_iteration_time: 0.5,
    },
    DemoApp {
        name: "wav2vec-search",
        explicit: false,
        jobs: 3,
        max_gpus: 2,
        iterations: 5_000,
        serial_iteration_time: 0.3,
    },
    DemoApp {
        name: "gpt-small-lr",
        explicit: true,
        jobs: 2,
        max_gpus: 8,
        iterations: 2_500,
        serial_iteration_time: 1.2,
    },
    DemoApp {
        name: "deepspeech-bs",
        explicit: false,
        jobs: 4,
        max_gpus: 2,
        iterations: 3_500,
        serial_iteration_time: 0.6,
    },
];

/// Creates the demo's tenants and apps and starts their drivers in the background.
pub async fn start(running: &Running, config: &ServerConfig) -> anyhow::Result<()> {
    let base = format!("http://{}", running.address);
    let admin = config
        .admin_token
        .clone()
        .ok_or_else(|| anyhow!("the demo needs an admin token"))?;
    let client = awc::Client::default();
    let mut tokens = Vec::new();
    for tenant in ["demo-vision", "demo-speech"] {
        let body = json!({ "name": tenant });
        match post(&client, &base, &admin, "/v1/tenants", body).await {
            Ok(created) => {
                let token = created["token"].as_str().map(str::to_owned);
                if let Some(token) = &token {
                    // Demo tokens only: they let a newcomer sign in to the dashboard as a tenant.
                    tracing::info!(tenant, token = %token, "demo tenant created");
                }
                tokens.push(token);
            }
            // 409: the tenant exists (a restart on the same database).
            Err(error) if error.to_string().starts_with("409") => {
                tracing::info!(
                    tenant,
                    "demo reuses the tenant and its apps from an earlier run on this database (its token was printed when it was created); no new apps are added"
                );
                tokens.push(None);
            }
            Err(error) => {
                tracing::warn!(tenant, %error, "demo tenant not created; its apps are not added");
                tokens.push(None);
            }
        }
    }
    for (index, app) in APPS.iter().enumerate() {
        let Some(token) = tokens[index % 2].clone() else {
            continue;
        };
        // Apps arrive a moment apart, as on a real cluster: their leases then end at different
        // times, and each round finds some apps holding GPUs and others waiting.
        if index > 0 {
            actix_web::rt::time::sleep(ARRIVAL_GAP).await;
        }
        let registered = post(&client, &base, &token, "/v1/apps", registration(app)).await?;
        let id = registered["id"]
            .as_i64()
            .ok_or_else(|| anyhow!("registration answered {registered}"))?;
        let driver = Driver {
            client: awc::Client::default(),
            base: base.clone(),
            token,
            app: id,
            explicit: app.explicit,
            serial_iteration_time: app.serial_iteration_time,
            jobs: (0..app.jobs)
                .map(|job| (format!("trial-{job}"), 0, app.iterations))
                .collect(),
            held_gpus: 0,
        };
        actix_web::rt::spawn(driver.run());
    }
    let dashboard = format!("{base}/");
    tracing::info!(%dashboard, admin_token = %admin, "demo running: tenants demo-vision and demo-speech, 6 apps; open the dashboard and sign in with a token");
    Ok(())
}

fn registration(app: &DemoApp) -> Value {
    let jobs: Vec<Value> = (0..app.jobs)
        .map(|job| {
            json!({
                "id": format!("trial-{job}"),
                "total_iterations": app.iterations,
                "serial_iteration_time": app.serial_iteration_time,
                "max_gpus": app.max_gpus,
            })
        })
        .collect();
    let curve: Vec<Value> = jobs
        .into_iter()
        .map(|job| json!({ "job": job, "predicted_final_iteration": app.iterations }))
        .collect();
    json!({
        "name": app.name,
        "bidding": if app.explicit { "explicit" } else { "agent" },
        "app": { "kind": "performance_curve", "jobs": curve },
    })
}

/// Plays one HPO framework: follows its app's events, bids when it bids explicitly, and
/// reports progress for the GPUs it holds.
struct Driver {
    client: awc::Client,
    base: String,
    token: String,
    app: i64,
    explicit: bool,
    serial_iteration_time: f64,
    /// (job, completed, total)
    jobs: Vec<(String, u64, u64)>,
    held_gpus: usize,
}

impl Driver {
    async fn run(mut self) {
        let mut after = 0;
        let mut last_report = Instant::now();
        loop {
            let path = format!(
                "/v1/apps/{}/events/poll?after={after}&timeout_ms=2000",
                self.app
            );
            match get(&self.client, &self.base, &self.token, &path).await {
                Ok(page) => {
                    after = page["last_id"].as_i64().unwrap_or(after);
                    for event in page["events"].as_array().into_iter().flatten() {
                        self.handle(event).await;
                    }
                }
                Err(error) => {
                    tracing::warn!(app = self.app, %error, "demo app cannot poll; retrying in 1 s");
                    actix_web::rt::time::sleep(Duration::from_secs(1)).await;
                }
            }
            let elapsed = last_report.elapsed();
            last_report = Instant::now();
            if self.advance(elapsed).await {
                tracing::info!(app = self.app, "demo app finished");
                return;
            }
        }
    }

    async fn handle(&mut self, event: &Value) {
        let payload = &event["payload"];
        match event["kind"].as_str() {
            Some("lease_granted") => {
                self.held_gpus += payload["gpus"].as_array().map_or(0, Vec::len)
            }
            Some("lease_ended") => {
                let ended = payload["gpus"].as_array().map_or(0, Vec::len);
                self.held_gpus = self.held_gpus.saturating_sub(ended);
            }
            Some("offer") if self.explicit => {
                let round = payload["round"].as_i64().unwrap_or_default();
                let path = format!("/v1/rounds/{round}/bids");
                if let Err(error) = post(
                    &self.client,
                    &self.base,
                    &self.token,
                    &path,
                    self.bid(payload),
                )
                .await
                {
                    tracing::warn!(app = self.app, round, %error, "demo bid refused");
                }
            }
            _ => {}
        }
    }

    /// A simple explicit bid: the first k offered GPUs, rho falling as k grows.
    fn bid(&self, offer: &Value) -> Value {
        let rho_old = offer["rho"].as_f64();
        let base = rho_old.unwrap_or(4.0);
        let wanted = offer["unmet_demand"].as_u64().unwrap_or(1) as usize;
        let gpus: Vec<&Value> = offer["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|gpu| &gpu["id"])
            .collect();
        let held = self.held_gpus as f64;
        let bids: Vec<Value> = (1..=wanted.min(gpus.len()).min(8))
            .map(|count| {
                json!({ "gpus": gpus[..count], "rho": base * (held + 1.0) / (held + count as f64 + 1.0) })
            })
            .collect();
        json!({ "app": self.app, "rho_old": rho_old, "bids": bids })
    }

    /// Credits the held GPUs' work to the jobs and reports it. True once the app finished.
    async fn advance(&mut self, elapsed: Duration) -> bool {
        // Demo time runs 20x faster than the wall clock, so apps finish within minutes.
        let iterations = (self.held_gpus as f64 * elapsed.as_secs_f64() * 20.0
            / self.serial_iteration_time) as u64;
        let mut budget = iterations;
        for (_, completed, total) in &mut self.jobs {
            let step = budget.min(*total - *completed);
            *completed += step;
            budget -= step;
        }
        if iterations == 0 {
            return false;
        }
        let jobs: Vec<Value> = self
            .jobs
            .iter()
            .map(|(job, completed, _)| json!({ "job": job, "completed_iterations": completed }))
            .collect();
        let path = format!("/v1/apps/{}/progress", self.app);
        match post(
            &self.client,
            &self.base,
            &self.token,
            &path,
            json!({ "jobs": jobs }),
        )
        .await
        {
            Ok(ack) => ack["finished"].as_bool().unwrap_or(false),
            Err(error) => {
                tracing::warn!(app = self.app, %error, "demo progress refused");
                false
            }
        }
    }
}

async fn post(
    client: &awc::Client,
    base: &str,
    token: &str,
    path: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let request = client.post(format!("{base}{path}")).bearer_auth(token);
    answer(
        request
            .send_json(&body)
            .await
            .map_err(|error| anyhow!("POST {path}: {error}"))?,
    )
    .await
}

async fn get(client: &awc::Client, base: &str, token: &str, path: &str) -> anyhow::Result<Value> {
    let request = client
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10));
    answer(
        request
            .send()
            .await
            .map_err(|error| anyhow!("GET {path}: {error}"))?,
    )
    .await
}

async fn answer<S>(mut response: awc::ClientResponse<S>) -> anyhow::Result<Value>
where
    S: futures_util::Stream<Item = Result<actix_web::web::Bytes, actix_web::error::PayloadError>>
        + Unpin,
{
    let status = response.status();
    let body = response
        .body()
        .limit(4 << 20)
        .await
        .context("reading the answer")?;
    let value: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)?
    };
    if status.is_success() {
        Ok(value)
    } else {
        Err(anyhow!(
            "{status}: {}",
            value["detail"].as_str().unwrap_or_default()
        ))
    }
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
