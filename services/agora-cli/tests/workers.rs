//! `agora worker`: without a driver it names the missing library; with the simulated backend it
//! prints its topology; and several worker processes register as different hosts with an
//! `agora serve` process over HTTP on loopback (fresh database, real Postgres).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{successful_stdout, unique_temp_path};

const AGORA: &str = env!("CARGO_BIN_EXE_agora");
const TOKEN: &str = "cli-test-worker-token";

fn example_topology() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../agora-worker/examples/dgx-like.toml")
}

fn agora(args: &[&str]) -> Output {
    Command::new(AGORA)
        .args(args)
        .env_remove("AGORA_WORKER_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("the agora binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn without_a_driver_the_worker_names_the_missing_library() {
    if Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    for args in [
        &[
            "worker",
            "--token",
            TOKEN,
            "--arbiter",
            "http://127.0.0.1:9",
        ][..],
        &["worker", "--discover"][..],
    ] {
        let output = agora(args);
        assert!(
            !output.status.success(),
            "{args:?} succeeded without a driver"
        );
        let message = stderr(&output);
        assert!(message.contains("libnvidia-ml.so.1"), "{message}");
        assert!(
            message.contains("--gpu-backend simulated --topology FILE"),
            "{message}"
        );
    }
}

#[test]
fn a_topology_file_alone_does_not_choose_the_simulated_backend() {
    let topology = example_topology();
    let output = agora(&[
        "worker",
        "--discover",
        "--topology",
        topology.to_str().expect("UTF-8 path"),
    ]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("add --gpu-backend simulated"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn discover_prints_the_gpus_the_matrix_and_the_slots() {
    let topology = example_topology();
    let output = agora(&[
        "worker",
        "--discover",
        "--gpu-backend",
        "simulated",
        "--topology",
        topology.to_str().expect("UTF-8 path"),
        "--host",
        "sim-host",
    ]);
    let text = String::from_utf8_lossy(successful_stdout(&output)).into_owned();
    assert!(text.contains("NVIDIA A100-SXM4-80GB"), "{text}");
    let row: Vec<&str> = text
        .lines()
        .rfind(|line| line.starts_with("GPU0 "))
        .expect("a matrix row for GPU0")
        .split_whitespace()
        .collect();
    assert_eq!(
        row,
        ["GPU0", "X", "NV12", "NV12", "NV12", "SYS", "SYS", "SYS", "SYS"]
    );
    assert!(text.contains("slot 0: GPU0 GPU1 GPU2 GPU3"), "{text}");
    assert!(text.contains("slot 1: GPU4 GPU5 GPU6 GPU7"), "{text}");
}

/// A child process killed when dropped, its stderr kept in a file.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(label: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = unique_temp_path("agora-cli-workers", &format!("{label}.log"));
        let mut command = Command::new(AGORA);
        // The settings come from the test alone, not from the environment it runs in.
        for (name, _) in std::env::vars() {
            if name == "DATABASE_URL" || name.starts_with("AGORA_") {
                command.env_remove(name);
            }
        }
        let child = command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the temporary directory is writable"))
            .spawn()
            .expect("the agora binary starts");
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A fresh database, dropped at the end.
struct Database {
    server: String,
    name: String,
}

impl Database {
    fn create() -> Self {
        let server = std::env::var("AGORA_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
        let name = format!("agora_cli_workers_{}", std::process::id());
        let database = Self { server, name };
        database.admin(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            database.name
        ));
        database.admin(&format!("CREATE DATABASE {}", database.name));
        database
    }

    fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    fn admin(&self, sql: &str) {
        let output = psql(&format!("{}/postgres", self.server), sql);
        assert!(
            output.status.success(),
            "psql (Postgres must run on 127.0.0.1:5432; scripts/test starts it): {}",
            stderr(&output)
        );
    }

    /// The rows of a query, one line each, columns joined by `|`.
    fn query(&self, sql: &str) -> String {
        let output = psql(&self.url(), sql);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = psql(
            &format!("{}/postgres", self.server),
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

fn psql(url: &str, sql: &str) -> Output {
    Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-tA", "-c", sql])
        .output()
        .expect("psql runs")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Whether `GET /healthz` answers 200.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reply = String::new();
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .and_then(|()| stream.read_to_string(&mut reply))
        .is_ok()
        && reply
            .lines()
            .next()
            .is_some_and(|status| status.contains(" 200 "))
}

/// Polls `check` for up to 60 s; on timeout fails with `what` and the processes' logs.
fn wait_until(what: &str, processes: &[&Process], mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs: Vec<String> = processes.iter().map(|process| process.log()).collect();
    panic!(
        "timed out waiting until {what}; logs:\n{}",
        logs.join("\n---\n")
    );
}

fn worker(host: &str, rack: &str, topology: &Path, port: u16) -> Process {
    let arbiter = format!("http://127.0.0.1:{port}");
    Process::spawn(
        host,
        &[
            "worker",
            "--gpu-backend",
            "simulated",
            "--topology",
            topology.to_str().expect("UTF-8 path"),
            "--host",
            host,
            "--rack",
            rack,
            "--arbiter",
            &arbiter,
        ],
        &[("AGORA_WORKER_TOKEN", TOKEN)],
    )
}

#[test]
fn several_workers_register_as_different_hosts() {
    let database = Database::create();
    let port = free_port();
    let config = unique_temp_path("agora-cli-workers", "arbiter.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase_url = \"{}\"\ngpus = \"workers\"\n\
             worker_token = \"{TOKEN}\"\nheartbeat_interval_ms = 200\nadmin_token = \"admin\"\n",
            database.url()
        ),
    )
    .expect("the temporary directory is writable");
    // One host whose GPU 2 falls off the bus from the start.
    let faulty = unique_temp_path("agora-cli-workers", "faulty.toml");
    let example = std::fs::read_to_string(example_topology()).expect("the example topology");
    std::fs::write(
        &faulty,
        format!("{example}\n[[faults]]\nkind = \"xid\"\ngpu = 2\nxid = 79\n"),
    )
    .expect("the temporary directory is writable");

    let arbiter = Process::spawn(
        "arbiter",
        &["serve", "--config", config.to_str().expect("UTF-8 path")],
        &[],
    );
    wait_until("the arbiter answers", &[&arbiter], || healthy(port));
    let topology = example_topology();
    let host_a = worker("gpu-a", "rack-1", &topology, port);
    let mut host_b = worker("gpu-b", "rack-1", &topology, port);
    let host_c = worker("gpu-c", "rack-2", &faulty, port);

    let hosts_up = "SELECT name || ':' || rack_name || ':' || status FROM hosts \
                    WHERE last_heartbeat_at IS NOT NULL ORDER BY name";
    wait_until(
        "three hosts heartbeat",
        &[&arbiter, &host_a, &host_b, &host_c],
        || database.query(hosts_up) == "gpu-a:rack-1:up\ngpu-b:rack-1:up\ngpu-c:rack-2:up",
    );
    assert_eq!(
        database.query("SELECT count(DISTINCT gpu_id) FROM worker_gpus"),
        "24",
        "each host registers its own 8 GPUs"
    );
    let unhealthy = "SELECT h.name || ':' || g.nvml_index || ':' || g.health_reason \
                     FROM worker_gpus g JOIN hosts h USING (machine_id) WHERE NOT g.healthy";
    wait_until("the XID is reported", &[&arbiter, &host_c], || {
        database.query(unhealthy) == "gpu-c:2:critical XID 79 raised by the driver"
    });

    // A host whose worker dies is marked down; it comes back when its worker returns.
    host_b.child.kill().expect("the worker runs");
    let _ = host_b.child.wait();
    let status_b = "SELECT status FROM hosts WHERE name = 'gpu-b'";
    wait_until("gpu-b is down", &[&arbiter], || {
        database.query(status_b) == "down"
    });
    host_b = worker("gpu-b", "rack-1", &topology, port);
    wait_until("gpu-b is back", &[&arbiter, &host_b], || {
        database.query(status_b) == "up"
    });
    drop(host_b);
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&faulty);
}
