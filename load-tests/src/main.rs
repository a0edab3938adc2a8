//! `agora-load`: load scenarios against a running arbiter. Scenarios and measured results: `load-tests/RESULTS.md`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agora_load::failover::{Arbiters, ServeCommand};
use agora_load::rss::resident_kib;
use agora_load::run::{create_tenants, run_threads, Outcome, Plan};
use agora_load::stats::{Live, Op, Stats};
use agora_load::verify::verify;
use anyhow::Context as _;
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// N apps (default 200) bid in every round they are offered GPUs, for a minute.
    Steady,
    /// 1000 apps register at once, then play for 30 s.
    Burst,
    /// `steady` for 10 minutes, sampling the server's memory.
    Soak,
    /// Bid throughput: 200 apps that release every lease at once, so rounds follow each other.
    Bids,
    /// 10,000 apps registered, then the server's memory sampled while rounds go on.
    Apps,
    /// Two arbiters on one database (started by the load generator, `--agora`); 50 apps play
    /// while the leader is killed with SIGKILL `--kills` times, each time started again as a
    /// standby. Every takeover is timed (at most 5 s to pass).
    Failover,
}

/// Load scenarios against a running arbiter (`agora serve`), then a correctness check in
/// Postgres. Exits 1 on any failed request or failed check.
#[derive(Debug, Parser)]
#[command(name = "agora-load")]
struct Args {
    #[arg(long, value_enum, default_value = "steady")]
    scenario: Scenario,
    /// The arbiter's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// The arbiter's admin token (creates the run's tenants).
    #[arg(long, env = "AGORA_ADMIN_TOKEN")]
    admin_token: String,
    /// The arbiter's database, to check every acknowledged bid and every lease afterwards.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The arbiter's process id, to sample its resident memory.
    #[arg(long)]
    server_pid: Option<u32>,
    #[arg(long)]
    apps: Option<usize>,
    #[arg(long, default_value_t = 10)]
    tenants: usize,
    /// One-GPU jobs per app (its demand).
    #[arg(long, default_value_t = 4)]
    jobs: u32,
    /// Seconds of play after registration.
    #[arg(long)]
    duration: Option<u64>,
    /// Milliseconds a lease is held before it is released.
    #[arg(long)]
    hold_ms: Option<u64>,
    /// Seconds to go on sampling memory after the players stop.
    #[arg(long)]
    settle: Option<u64>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 10)]
    sample_secs: u64,
    /// failover: the `agora` binary that runs the arbiters.
    #[arg(long, default_value = "target/debug/agora")]
    agora: std::path::PathBuf,
    /// failover: the arbiters' config (`agora serve --config`; their addresses and database
    /// come from `--arbiters` and `--database-url`).
    #[arg(long, default_value = "load-tests/arbiter.toml")]
    arbiter_config: std::path::PathBuf,
    /// failover: the loopback addresses of the arbiters, comma-separated.
    #[arg(long, default_value = "127.0.0.1:18080,127.0.0.1:18081")]
    arbiters: String,
    /// failover: how many times the leader is killed.
    #[arg(long, default_value_t = 100)]
    kills: usize,
    /// failover: milliseconds of play between a killed arbiter answering again and the next kill.
    #[arg(long, default_value_t = 1000)]
    kill_every_ms: u64,
    /// failover: where the arbiters' logs go (`arbiter-<n>.log`).
    #[arg(long, default_value = "target/failover")]
    log_dir: std::path::PathBuf,
}

struct Preset {
    apps: usize,
    duration: u64,
    hold_ms: u64,
    settle: u64,
    burst: bool,
}

fn preset(scenario: Scenario) -> Preset {
    let steady = Preset {
        apps: 200,
        duration: 60,
        hold_ms: 200,
        settle: 0,
        burst: false,
    };
    match scenario {
        Scenario::Steady => steady,
        Scenario::Burst => Preset {
            apps: 1000,
            duration: 30,
            burst: true,
            ..steady
        },
        Scenario::Soak => Preset {
            duration: 600,
            ..steady
        },
        Scenario::Bids => Preset {
            hold_ms: 0,
            ..steady
        },
        Scenario::Apps => Preset {
            apps: 10_000,
            duration: 0,
            settle: 60,
            ..steady
        },
        // Played until the kills are done.
        Scenario::Failover => Preset {
            apps: 50,
            duration: 24 * 3600,
            ..steady
        },
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<bool> {
    let mut arbiters = match args.scenario {
        Scenario::Failover => Some(start_arbiters(args)?),
        _ => None,
    };
    let preset = preset(args.scenario);
    let apps = args.apps.unwrap_or(preset.apps);
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let plan = Plan {
        base: arbiters
            .as_ref()
            .map_or_else(|| args.base.clone(), Arbiters::bases),
        admin_token: args.admin_token.clone(),
        label: format!("load-{}", since_epoch.as_millis()),
        tenants: args.tenants,
        apps,
        jobs_per_app: args.jobs,
        register_concurrency: if preset.burst { apps } else { 16 },
        duration: Duration::from_secs(args.duration.unwrap_or(preset.duration)),
        hold: Duration::from_millis(args.hold_ms.unwrap_or(preset.hold_ms)),
        poll_timeout: Duration::from_secs(5),
        threads: args.threads,
    };
    println!(
        "scenario {:?}: {} apps of {} jobs, {} tenants, {} s of play, leases held {} ms, {} threads, against {}",
        args.scenario, plan.apps, plan.jobs_per_app, plan.tenants, plan.duration.as_secs(),
        plan.hold.as_millis(), plan.threads, plan.base
    );
    let live = Arc::new(Live::default());
    let mut setup = Stats::default();
    let tokens = actix_rt::System::new().block_on(create_tenants(&plan, &mut setup, &live))?;

    let started = Instant::now();
    let runner = {
        let (plan, live) = (plan.clone(), live.clone());
        std::thread::spawn(move || run_threads(&plan, tokens, live))
    };
    let mut sampler = Sampler::new(args.server_pid, Duration::from_secs(args.sample_secs));
    let takeovers = arbiters
        .as_mut()
        .map(|arbiters| kill_leaders(arbiters, args, &live, &mut sampler, started));
    while !runner.is_finished() {
        sampler.tick(started, &live);
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut outcome: Outcome = runner
        .join()
        .map_err(|_| anyhow::anyhow!("the load thread panicked"))?;
    let played = started.elapsed().saturating_sub(outcome.register_elapsed);
    let settle_until = Instant::now() + Duration::from_secs(args.settle.unwrap_or(preset.settle));
    while Instant::now() < settle_until {
        sampler.tick(started, &live);
        std::thread::sleep(Duration::from_millis(100));
    }
    sampler.sample(started, &live);
    outcome.stats.merge(setup);

    println!(
        "\n{} apps registered in {:.1} s ({:.0}/s)",
        outcome.registered,
        outcome.register_elapsed.as_secs_f64(),
        outcome.registered as f64 / outcome.register_elapsed.as_secs_f64().max(1e-9)
    );
    println!(
        "{} s of play: {:.0} acknowledged bids/s\n",
        played.as_secs(),
        outcome.stats.count(Op::Bid) as f64 / played.as_secs_f64().max(1e-9)
    );
    println!("{}", outcome.stats.table(played));
    println!("(register is over the registration phase; per-second rates are over the play phase)");
    let errors = outcome.stats.error_count();
    println!("\nerrors: {errors}");
    for (label, count) in &outcome.stats.errors {
        println!("  {label}: {count}");
    }
    sampler.print_memory();

    let mut passed = errors == 0;
    if let Some(arbiters) = arbiters {
        arbiters.stop();
    }
    if let Some(takeovers) = takeovers {
        // Failed requests are expected around a kill (a release retried after it committed is
        // 409): what must hold is in Postgres, and the takeovers.
        passed = match takeovers {
            Ok(takeovers) => report_takeovers(&takeovers, args.kills),
            Err(error) => {
                println!("\nthe kills stopped: {error:#}");
                false
            }
        };
    }
    match &args.database_url {
        Some(url) => {
            let verification = actix_rt::System::new().block_on(verify(url, &outcome.acked))?;
            println!("\ncheck: {}", verification.summary());
            passed &= verification.passed();
        }
        None => println!("\ncheck: skipped (no --database-url)"),
    }
    println!("{}", if passed { "PASSED" } else { "FAILED" });
    Ok(passed)
}

fn start_arbiters(args: &Args) -> anyhow::Result<Arbiters> {
    let database_url = args
        .database_url
        .clone()
        .context("the failover scenario needs --database-url (or DATABASE_URL)")?;
    std::fs::create_dir_all(&args.log_dir)?;
    let command = ServeCommand {
        agora: args.agora.clone(),
        config: args.arbiter_config.clone(),
        database_url,
        admin_token: args.admin_token.clone(),
        log_dir: args.log_dir.clone(),
    };
    let addresses = args.arbiters.split(',').map(str::to_owned).collect();
    Arbiters::start(command, addresses)
}

/// Kills the leader `--kills` times while the players play, then stops them; each takeover's
/// time.
fn kill_leaders(
    arbiters: &mut Arbiters,
    args: &Args,
    live: &Live,
    sampler: &mut Sampler,
    started: Instant,
) -> anyhow::Result<Vec<Duration>> {
    let pause = Duration::from_millis(args.kill_every_ms);
    let mut takeovers = Vec::with_capacity(args.kills);
    let result = (|| {
        // Kills start once the players bid.
        while live.snapshot().0 == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        for kill in 1..=args.kills {
            std::thread::sleep(pause);
            let takeover = arbiters.kill_leader()?;
            println!(
                "kill {kill}: a standby led {:.0} ms after the leader was killed",
                takeover.as_secs_f64() * 1e3
            );
            takeovers.push(takeover);
            sampler.tick(started, live);
        }
        anyhow::Ok(())
    })();
    live.stop();
    result.map(|()| takeovers)
}

/// Prints the takeovers' times; whether every kill was done and every takeover took at most 5 s.
fn report_takeovers(takeovers: &[Duration], kills: usize) -> bool {
    const BOUND: Duration = Duration::from_secs(5);
    let mut millis: Vec<f64> = takeovers.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    millis.sort_by(f64::total_cmp);
    let at = |q: f64| {
        millis
            .get(((millis.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let over = takeovers.iter().filter(|t| **t > BOUND).count();
    println!(
        "\ntakeovers: {} of {kills} kills; min {:.0} ms, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {over} over 5 s",
        takeovers.len(), at(0.0), at(0.5), at(0.99), at(1.0)
    );
    takeovers.len() == kills && over == 0
}

/// Progress lines every `every`: bids and requests per second since the last line, errors so
/// far, and the server's resident memory.
struct Sampler {
    pid: Option<u32>,
    every: Duration,
    last: Option<(Instant, u64, u64)>,
    memory: Vec<(u64, u64)>,
}

impl Sampler {
    fn new(pid: Option<u32>, every: Duration) -> Self {
        Self {
            pid,
            every,
            last: None,
            memory: Vec::new(),
        }
    }

    fn tick(&mut self, started: Instant, live: &Live) {
        match self.last {
            Some((at, _, _)) if at.elapsed() < self.every => {}
            _ => self.sample(started, live),
        }
    }

    fn sample(&mut self, started: Instant, live: &Live) {
        let (bids, requests, errors) = live.snapshot();
        let now = Instant::now();
        let (at, last_bids, last_requests) = self.last.unwrap_or((started, 0, 0));
        let seconds = now.duration_since(at).as_secs_f64().max(1e-9);
        let rss = self.pid.and_then(resident_kib);
        let elapsed = now.duration_since(started).as_secs();
        if let Some(kib) = rss {
            self.memory.push((elapsed, kib));
        }
        println!(
            "t={elapsed:>4}s  bids/s={:>6.0}  requests/s={:>6.0}  errors={errors}  server rss={}",
            (bids - last_bids) as f64 / seconds,
            (requests - last_requests) as f64 / seconds,
            rss.map_or("-".to_owned(), |kib| format!(
                "{:.1} MiB",
                kib as f64 / 1024.0
            )),
        );
        self.last = Some((now, bids, requests));
    }

    fn print_memory(&self) {
        let (Some(first), Some(last)) = (self.memory.first(), self.memory.last()) else {
            return;
        };
        let peak = self.memory.iter().map(|(_, kib)| *kib).max().unwrap_or(0);
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "\nserver rss: {:.1} MiB at t={}s, {:.1} MiB at t={}s, peak {:.1} MiB ({} samples)",
            mib(first.1),
            first.0,
            mib(last.1),
            last.0,
            mib(peak),
            self.memory.len()
        );
    }
}
