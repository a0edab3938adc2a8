//! `agora serve` settings: a TOML file, then environment overrides, then validation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_market::market::MarketConfig;
use agora_market::shown::Shown;
use serde::Deserialize;

/// The settings of one arbiter. Every field has a default, so an empty file is valid.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: String,
    /// The URL clients and the other arbiters of the database reach this one at: a standby
    /// names the leader's in the `not_leader` answers it gives writers. Default
    /// `http://<the address listened on>`; set it when that is not reachable from elsewhere
    /// (`0.0.0.0`, a container).
    pub advertise_url: Option<String>,
    pub database_url: String,
    /// Token that may create tenants and see everything. Without one, admin endpoints answer 403.
    pub admin_token: Option<String>,
    /// A file holding the admin token (its first line; a secret mounted by Docker or
    /// Kubernetes, say): a stable credential kept out of the config and the environment.
    /// Read at start; not with `admin_token`.
    pub admin_token_file: Option<PathBuf>,
    /// Where the GPUs come from: `simulated` (the default: the `fleet` file, mirrored
    /// in-process) or `workers` (GPU hosts running `agora worker` register over HTTP; the
    /// cluster starts empty and grows as they do; `fleet` is not read).
    pub gpus: GpuSource,
    /// The simulated GPU fleet: a cluster file (the simulator's format). Only with
    /// `gpus = "simulated"`. The default is Themis's testbed with its Azure machines' CPUs and
    /// memory, so leases carry CPU cores and memory too.
    pub fleet: PathBuf,
    /// The bearer token `agora worker` presents (`Authorization: Bearer`). Required with
    /// `gpus = "workers"`; the worker endpoints are closed otherwise.
    pub worker_token: Option<String>,
    /// How often workers heartbeat; a host silent for two intervals loses its leases.
    pub heartbeat_interval_ms: u64,
    /// Themis's f: the worst (1 - f) fraction of apps by rho bid in each round.
    pub fairness_knob: f64,
    pub lease_seconds: u64,
    /// How long bidders have to bid once a round opens.
    pub round_deadline_ms: u64,
    /// Notice given before a lease is revoked (a GPU drained), so jobs can checkpoint.
    pub revocation_grace_seconds: u64,
    /// How often the lease manager reads the clock for due timers.
    pub tick_ms: u64,
    /// The longest a statement of an auditor (a member of `agora_auditor`) may run: the
    /// arbiter cancels it after that, whatever `statement_timeout` the auditor set.
    pub auditor_statement_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".to_owned(),
            advertise_url: None,
            database_url: "postgres://postgres@127.0.0.1:5432/agora".to_owned(),
            admin_token: None,
            admin_token_file: None,
            gpus: GpuSource::Simulated,
            fleet: PathBuf::from("services/agora-sim/clusters/themis-testbed-azure.toml"),
            worker_token: None,
            heartbeat_interval_ms: 5_000,
            fairness_knob: 0.8,
            lease_seconds: 600,
            round_deadline_ms: 2_000,
            revocation_grace_seconds: 30,
            tick_ms: 100,
            auditor_statement_timeout_ms: 30_000,
        }
    }
}

/// Where the arbiter's GPUs come from (`gpus` in the config, or `AGORA_GPUS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSource {
    /// A simulated fleet from the `fleet` cluster file (`--demo`, tests).
    #[default]
    Simulated,
    /// Real (or simulated-backend) hosts running `agora worker`.
    Workers,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {name}={value:?} is not valid: {reason}")]
    Env {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl ServerConfig {
    /// Reads `path` (if given), applies environment overrides from `env`, and validates.
    pub fn load(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => Self::parse_file(path)?,
            None => Self::default(),
        };
        config.apply_environment(env)?;
        config.read_admin_token_file()?;
        config.validate()?;
        Ok(config)
    }

    /// The admin token from `admin_token_file`, if set.
    fn read_admin_token_file(&mut self) -> Result<(), ConfigError> {
        let Some(path) = &self.admin_token_file else {
            return Ok(());
        };
        if self.admin_token.is_some() {
            return Err(ConfigError::Invalid(
                "set the admin token once: admin_token (AGORA_ADMIN_TOKEN) or admin_token_file (AGORA_ADMIN_TOKEN_FILE), not both".to_owned(),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        self.admin_token = Some(text.lines().next().unwrap_or("").trim().to_owned());
        Ok(())
    }

    fn parse_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.to_owned(),
            message: error.to_string(),
        })
    }

    /// `DATABASE_URL`, `AGORA_LISTEN`, `AGORA_ADVERTISE_URL`, `AGORA_ADMIN_TOKEN`,
    /// `AGORA_FLEET`, `AGORA_LEASE_SECONDS`, `AGORA_GPUS` and `AGORA_WORKER_TOKEN` override the
    /// file.
    fn apply_environment(
        &mut self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(value) = env("DATABASE_URL") {
            self.database_url = value;
        }
        if let Some(value) = env("AGORA_LISTEN") {
            self.listen = value;
        }
        if let Some(value) = env("AGORA_ADVERTISE_URL") {
            self.advertise_url = Some(value);
        }
        if let Some(value) = env("AGORA_ADMIN_TOKEN") {
            self.admin_token = Some(value);
        }
        if let Some(value) = env("AGORA_ADMIN_TOKEN_FILE") {
            self.admin_token_file = Some(PathBuf::from(value));
        }
        if let Some(value) = env("AGORA_FLEET") {
            self.fleet = PathBuf::from(value);
        }
        if let Some(value) = env("AGORA_WORKER_TOKEN") {
            self.worker_token = Some(value);
        }
        if let Some(value) = env("AGORA_GPUS") {
            self.gpus = match value.as_str() {
                "simulated" => GpuSource::Simulated,
                "workers" => GpuSource::Workers,
                _ => {
                    return Err(ConfigError::Env {
                        name: "AGORA_GPUS",
                        value,
                        reason: "expected `simulated` or `workers`".to_owned(),
                    })
                }
            };
        }
        if let Some(value) = env("AGORA_LEASE_SECONDS") {
            self.lease_seconds = value.parse().map_err(|_| ConfigError::Env {
                name: "AGORA_LEASE_SECONDS",
                value,
                reason: "expected a whole number of seconds".to_owned(),
            })?;
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..1.0).contains(&self.fairness_knob) {
            return Err(ConfigError::Invalid(format!(
                "fairness_knob must lie in [0, 1), got {}",
                Shown(self.fairness_knob)
            )));
        }
        let positive = [
            ("lease_seconds", self.lease_seconds),
            ("round_deadline_ms", self.round_deadline_ms),
            ("tick_ms", self.tick_ms),
            (
                "auditor_statement_timeout_ms",
                self.auditor_statement_timeout_ms,
            ),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(ConfigError::Invalid(format!(
                "{name} must be greater than 0"
            )));
        }
        if self.admin_token.as_deref() == Some("") {
            return Err(ConfigError::Invalid(
                "admin_token is empty; set a long random value or leave it out".to_owned(),
            ));
        }
        match (self.gpus, self.worker_token.as_deref()) {
            (GpuSource::Workers, None | Some("")) => Err(ConfigError::Invalid(
                "gpus = \"workers\" needs a worker_token (or AGORA_WORKER_TOKEN): a long random value that every `agora worker` presents".to_owned(),
            )),
            _ => Ok(()),
        }
    }

    /// The worker token, when hosts may register (`gpus = "workers"`).
    pub fn accepted_worker_token(&self) -> Option<&str> {
        match self.gpus {
            GpuSource::Workers => self.worker_token.as_deref(),
            GpuSource::Simulated => None,
        }
    }

    /// The URL this arbiter advertises, listening on `address`.
    pub fn advertise_url(&self, address: std::net::SocketAddr) -> String {
        self.advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{address}"))
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    /// The engine's settings. The service always runs Themis with the engine's default
    /// (worst-first) leftover rule, whose rounds can be replayed from their stored inputs.
    pub fn market(&self) -> MarketConfig {
        MarketConfig {
            fairness_knob: self.fairness_knob,
            lease_length: Duration::from_secs(self.lease_seconds),
            ..MarketConfig::default()
        }
    }

    pub fn round_deadline(&self) -> Duration {
        Duration::from_millis(self.round_deadline_ms)
    }

    pub fn revocation_grace(&self) -> Duration {
        Duration::from_secs(self.revocation_grace_seconds)
    }

    pub fn auditor_statement_timeout(&self) -> Duration {
        Duration::from_millis(self.auditor_statement_timeout_ms)
    }

    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let config: ServerConfig = toml::from_str("").expect("empty config");
        assert_eq!(config, ServerConfig::default());
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://db/agora".to_owned()),
            "AGORA_LEASE_SECONDS" => Some("30".to_owned()),
            _ => None,
        };
        let config = ServerConfig::load(None, env).expect("valid");
        assert_eq!(config.database_url, "postgres://db/agora");
        assert_eq!(config.lease_seconds, 30);
        assert_eq!(config.listen, ServerConfig::default().listen);
    }

    #[test]
    fn bad_settings_are_named() {
        let env = |name: &str| (name == "AGORA_LEASE_SECONDS").then(|| "ten".to_owned());
        let error = ServerConfig::load(None, env).expect_err("not a number");
        assert!(error.to_string().contains("AGORA_LEASE_SECONDS"), "{error}");

        let dir = std::env::temp_dir().join(format!("agora-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("agora.toml");
        std::fs::write(&file, "fairness_knob = 1.5\n").expect("write");
        let error = ServerConfig::load(Some(&file), no_env).expect_err("f out of range");
        assert!(error.to_string().contains("fairness_knob"), "{error}");
        std::fs::write(&file, "lease = 3\n").expect("write");
        let error = ServerConfig::load(Some(&file), no_env).expect_err("unknown key");
        assert!(error.to_string().contains("lease"), "{error}");
    }

    #[test]
    fn the_admin_token_can_come_from_a_file_and_only_from_one_place() {
        let dir = std::env::temp_dir().join(format!("agora-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("admin-token");
        std::fs::write(&file, "s3cret-admin\n").expect("write");
        let path = file.to_string_lossy().into_owned();
        let from_file = |name: &str| (name == "AGORA_ADMIN_TOKEN_FILE").then(|| path.clone());
        let config = ServerConfig::load(None, from_file).expect("valid");
        assert_eq!(config.admin_token.as_deref(), Some("s3cret-admin"));
        let both = |name: &str| match name {
            "AGORA_ADMIN_TOKEN_FILE" => Some(path.clone()),
            "AGORA_ADMIN_TOKEN" => Some("other".to_owned()),
            _ => None,
        };
        let error = ServerConfig::load(None, both).expect_err("two admin tokens");
        assert!(error.to_string().contains("admin_token_file"), "{error}");
        std::fs::write(&file, "\n").expect("write");
        let error = ServerConfig::load(None, from_file).expect_err("an empty token");
        assert!(error.to_string().contains("admin_token"), "{error}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn workers_mode_needs_a_worker_token_and_opens_the_worker_endpoints_only_then() {
        let workers = |name: &str| (name == "AGORA_GPUS").then(|| "workers".to_owned());
        let error = ServerConfig::load(None, workers).expect_err("no token");
        assert!(error.to_string().contains("worker_token"), "{error}");

        let env = |name: &str| match name {
            "AGORA_GPUS" => Some("workers".to_owned()),
            "AGORA_WORKER_TOKEN" => Some("secret".to_owned()),
            _ => None,
        };
        let config = ServerConfig::load(None, env).expect("valid");
        assert_eq!(config.gpus, GpuSource::Workers);
        assert_eq!(config.accepted_worker_token(), Some("secret"));

        let simulated = |name: &str| (name == "AGORA_WORKER_TOKEN").then(|| "secret".to_owned());
        let config = ServerConfig::load(None, simulated).expect("valid");
        assert_eq!(
            config.accepted_worker_token(),
            None,
            "a simulated fleet takes no workers"
        );
        let typo = |name: &str| (name == "AGORA_GPUS").then(|| "worker".to_owned());
        let error = ServerConfig::load(None, typo).expect_err("unknown source");
        assert!(error.to_string().contains("AGORA_GPUS"), "{error}");
    }
}
