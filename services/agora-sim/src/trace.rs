//! Workload importers: the project's JSON format ([`Workload`] as serde writes it) and the job
//! traces of the Tiresias simulator (CSV). Errors name the file and the line (and the column
//! or field) at fault.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use agora_market::app::{App, AppId, AppKind, Job};
use agora_market::shown::Shown;

use crate::models;
use crate::workload::{Workload, WorkloadApp};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Malformed JSON, an unknown field or a wrong type, at `line`:`column` (1-based).
    #[error("{}:{line}:{column}: invalid workload JSON: {message}", path.display())]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// A bad row (or header) of a Tiresias CSV trace at `line` (1-based, the header is 1).
    #[error("{}:{line}: {problem}", path.display())]
    Csv {
        path: PathBuf,
        line: usize,
        problem: CsvProblem,
    },
    /// Well-formed, but not a workload the simulator can run.
    #[error("{}: invalid workload: {problem}", path.display())]
    Invalid {
        path: PathBuf,
        problem: WorkloadProblem,
    },
}

/// What is wrong with one line of a CSV trace.
#[derive(Debug, Clone, PartialEq)]
pub enum CsvProblem {
    /// The file is empty: the header is missing.
    MissingHeader,
    /// The header does not name exactly the trace's columns.
    BadHeader(String),
    /// The row has `found` fields where the header has `expected`.
    FieldCount { expected: usize, found: usize },
    /// Field `field` (column `column`, 1-based) holds `value`, which is not `expected`.
    BadField {
        field: &'static str,
        column: usize,
        value: String,
        expected: &'static str,
    },
    /// The job id was already used on line `first_line`.
    DuplicateJob { job_id: String, first_line: usize },
}

impl fmt::Display for CsvProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CsvProblem::MissingHeader => write!(
                f,
                "empty file: expected the header `{}`",
                TIRESIAS_COLUMNS.join(",")
            ),
            CsvProblem::BadHeader(reason) => write!(
                f,
                "bad header ({reason}): expected the columns `{}`",
                TIRESIAS_COLUMNS.join(",")
            ),
            CsvProblem::FieldCount { expected, found } => {
                write!(
                    f,
                    "expected {expected} comma-separated fields, found {found}"
                )
            }
            CsvProblem::BadField {
                field,
                column,
                value,
                expected,
            } => write!(
                f,
                "column {column} (`{field}`): `{value}` is not {expected}"
            ),
            CsvProblem::DuplicateJob { job_id, first_line } => {
                write!(f, "job_id `{job_id}` already used on line {first_line}")
            }
        }
    }
}

/// Why a parsed workload cannot be simulated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadProblem {
    #[error("app id `{0}` appears twice")]
    DuplicateApp(String),
    #[error("job id `{job}` appears twice (app `{app}`)")]
    DuplicateJob { app: String, job: String },
    #[error("app `{app}`: {reason}")]
    App { app: String, reason: String },
    #[error("the workload has no apps: there is nothing to simulate")]
    Empty,
}

/// The latest arrival a workload may have: 31 years. Later ones are errors (a timestamp in
/// milliseconds since the epoch given as seconds, say), not workloads.
pub const MAX_ARRIVAL_SECONDS: f64 = 1e9;

/// The longest a job may run on all its GPUs: 116 days. Every lease of it is a round, so a
/// longer one would simulate for hours to tell nothing a shorter trace would not.
pub const MAX_JOB_SECONDS: f64 = 1e7;

/// Checks what the engine's types cannot: unique app and job ids, finite non-negative
/// arrivals, and per job positive iterations and iteration times, at least one GPU and
/// slowdowns >= 1; successive-halving plans that are consistent; and at least one job to run.
pub fn check_workload(workload: &Workload) -> Result<(), WorkloadProblem> {
    if workload.apps.is_empty() {
        return Err(WorkloadProblem::Empty);
    }
    let mut app_ids = BTreeSet::new();
    let mut job_ids = BTreeSet::new();
    for entry in &workload.apps {
        let app = &entry.app.id.0;
        let fail = |reason: String| WorkloadProblem::App {
            app: app.clone(),
            reason,
        };
        if !app_ids.insert(app.clone()) {
            return Err(WorkloadProblem::DuplicateApp(app.clone()));
        }
        if !(entry.arrival_seconds.is_finite()
            && (0.0..=MAX_ARRIVAL_SECONDS).contains(&entry.arrival_seconds))
        {
            return Err(fail(format!(
                "arrival_seconds must be a number of seconds in [0, {MAX_ARRIVAL_SECONDS:e}] \
                 (31 years), got {}",
                Shown(entry.arrival_seconds)
            )));
        }
        entry.app.validate().map_err(fail)?;
        for job in entry.app.jobs() {
            let seconds = job.serial_seconds(0.0, job.total_iterations as f64)
                / f64::from(job.max_gpus.max(1));
            if seconds > MAX_JOB_SECONDS {
                return Err(fail(format!(
                    "job `{}` runs {seconds:e} s even on all its {} GPUs, more than the \
                     simulator's limit of {MAX_JOB_SECONDS:e} s (116 days); split it or \
                     scale the trace down",
                    job.id, job.max_gpus
                )));
            }
        }
        for job in entry.app.jobs() {
            if !job_ids.insert(job.id.clone()) {
                return Err(WorkloadProblem::DuplicateJob {
                    app: app.clone(),
                    job: job.id.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Reads a workload in the project's JSON format (unknown fields are rejected) and checks it.
pub fn load_workload_json(path: impl AsRef<Path>) -> Result<Workload, TraceError> {
    let path = path.as_ref();
    let text = read(path)?;
    parse_workload_json(&text, path)
}

/// Parses and checks a JSON workload; `path` names it in errors.
pub fn parse_workload_json(text: &str, path: &Path) -> Result<Workload, TraceError> {
    let workload: Workload = serde_json::from_str(text).map_err(|error| {
        // serde_json appends the position, which the error already carries.
        let message = error.to_string();
        let position = format!(" at line {} column {}", error.line(), error.column());
        TraceError::Json {
            path: path.to_owned(),
            line: error.line(),
            column: error.column(),
            message: message
                .strip_suffix(&position)
                .unwrap_or(&message)
                .to_owned(),
        }
    })?;
    check_workload(&workload).map_err(|problem| TraceError::Invalid {
        path: path.to_owned(),
        problem,
    })?;
    Ok(workload)
}

/// Writes a workload as pretty JSON (the format [`load_workload_json`] reads).
pub fn save_workload_json(workload: &Workload, path: impl AsRef<Path>) -> Result<(), TraceError> {
    let path = path.as_ref();
    let mut text = serde_json::to_string_pretty(workload).map_err(|error| TraceError::Write {
        path: path.to_owned(),
        source: std::io::Error::other(error),
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(|source| TraceError::Write {
        path: path.to_owned(),
        source,
    })
}

/// The columns of a Tiresias job trace, in their usual order (any order is accepted).
pub const TIRESIAS_COLUMNS: [&str; 7] = [
    "job_id",
    "num_gpu",
    "submit_time",
    "iterations",
    "model_name",
    "duration",
    "interval",
];

/// Reads a Tiresias simulator job trace (CSV, see [`parse_tiresias_csv`]).
pub fn load_tiresias_csv(path: impl AsRef<Path>) -> Result<Workload, TraceError> {
    let path = path.as_ref();
    let text = read(path)?;
    parse_tiresias_csv(&text, path)
}

/// Parses a Tiresias job trace: a header naming the columns `job_id, num_gpu, submit_time,
/// iterations, model_name, duration, interval` (any order, no others), then one job per line,
/// fields separated by commas (no quoting; spaces around fields and blank lines are ignored;
/// CRLF is fine). Each row becomes a single-job app `trace-<job_id>` (job `trace-<job_id>-j000`)
/// arriving at `submit_time` seconds, demanding `num_gpu` GPUs, running `iterations`
/// iterations of `duration x num_gpu / iterations` seconds each on one GPU (`duration` is the
/// job's wall time on its `num_gpu` GPUs), with its model's slowdowns from the catalogue
/// (unknown models get [`models::DEFAULT_SLOWDOWN`]). `interval` (the gap to the next
/// submission) must be a number but is not used. Apps are sorted by arrival (stably).
pub fn parse_tiresias_csv(text: &str, path: &Path) -> Result<Workload, TraceError> {
    let csv_error = |line: usize, problem: CsvProblem| TraceError::Csv {
        path: path.to_owned(),
        line,
        problem,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty());
    let Some((header_line, header)) = lines.next() else {
        return Err(csv_error(1, CsvProblem::MissingHeader));
    };
    let positions = header_positions(header).map_err(|problem| csv_error(header_line, problem))?;
    let width = TIRESIAS_COLUMNS.len();
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut apps = Vec::new();
    for (line_number, line) in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != width {
            return Err(csv_error(
                line_number,
                CsvProblem::FieldCount {
                    expected: width,
                    found: fields.len(),
                },
            ));
        }
        let row = Row {
            fields: &fields,
            positions: &positions,
        };
        let app = row
            .to_app()
            .map_err(|problem| csv_error(line_number, problem))?;
        let job_id = row.text(0);
        if let Some(&first_line) = seen.get(job_id) {
            return Err(csv_error(
                line_number,
                CsvProblem::DuplicateJob {
                    job_id: job_id.to_owned(),
                    first_line,
                },
            ));
        }
        seen.insert(job_id.to_owned(), line_number);
        apps.push(app);
    }
    apps.sort_by(|a, b| a.arrival_seconds.total_cmp(&b.arrival_seconds));
    let workload = Workload { apps };
    check_workload(&workload).map_err(|problem| TraceError::Invalid {
        path: path.to_owned(),
        problem,
    })?;
    Ok(workload)
}

/// For each of TIRESIAS_COLUMNS, its position in the header.
fn header_positions(header: &str) -> Result<[usize; 7], CsvProblem> {
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let mut positions = [usize::MAX; 7];
    for (position, name) in names.iter().enumerate() {
        let Some(column) = TIRESIAS_COLUMNS.iter().position(|column| column == name) else {
            return Err(CsvProblem::BadHeader(format!("unknown column `{name}`")));
        };
        if positions[column] != usize::MAX {
            return Err(CsvProblem::BadHeader(format!(
                "column `{name}` appears twice"
            )));
        }
        positions[column] = position;
    }
    if let Some(missing) = (0..7).find(|&column| positions[column] == usize::MAX) {
        return Err(CsvProblem::BadHeader(format!(
            "column `{}` is missing",
            TIRESIAS_COLUMNS[missing]
        )));
    }
    Ok(positions)
}

struct Row<'a> {
    fields: &'a [&'a str],
    positions: &'a [usize; 7],
}

impl Row<'_> {
    fn text(&self, column: usize) -> &str {
        self.fields[self.positions[column]]
    }

    fn bad(&self, column: usize, expected: &'static str) -> CsvProblem {
        CsvProblem::BadField {
            field: TIRESIAS_COLUMNS[column],
            column: self.positions[column] + 1,
            value: self.text(column).to_owned(),
            expected,
        }
    }

    fn positive_integer(&self, column: usize) -> Result<u64, CsvProblem> {
        match self.text(column).parse::<u64>() {
            Ok(value) if value > 0 => Ok(value),
            _ => Err(self.bad(column, "a positive integer")),
        }
    }

    fn number(&self, column: usize, positive: bool) -> Result<f64, CsvProblem> {
        let expected = if positive {
            "a positive number"
        } else {
            "a number >= 0"
        };
        match self.text(column).parse::<f64>() {
            Ok(value) if value.is_finite() && (value > 0.0 || (!positive && value == 0.0)) => {
                Ok(value)
            }
            _ => Err(self.bad(column, expected)),
        }
    }

    fn to_app(&self) -> Result<WorkloadApp, CsvProblem> {
        let job_id = self.text(0);
        if job_id.is_empty() || job_id.contains(char::is_whitespace) {
            return Err(self.bad(0, "a job id (non-empty, no spaces)"));
        }
        let num_gpu = u32::try_from(self.positive_integer(1)?)
            .map_err(|_| self.bad(1, "a GPU count that fits in 32 bits"))?;
        let submit_time = self.number(2, false)?;
        let iterations = self.positive_integer(3)?;
        let model = self.text(4);
        if model.is_empty() {
            return Err(self.bad(4, "a model name"));
        }
        let duration = self.number(5, true)?;
        self.number(6, false)?;
        let id = format!("trace-{job_id}");
        let job = Job {
            id: format!("{id}-j000"),
            total_iterations: iterations,
            completed_iterations: 0,
            serial_iteration_time: duration * f64::from(num_gpu) / iterations as f64,
            max_gpus: num_gpu,
            slowdown: models::slowdown_of(model),
            stopped: false,
            speed_changes: Vec::new(),
        };
        Ok(WorkloadApp {
            arrival_seconds: submit_time,
            model: model.to_owned(),
            app: App {
                id: AppId(id),
                kind: AppKind::SingleJob {
                    job,
                    throughput: Default::default(),
                    sensitivity: Default::default(),
                },
            },
            job_quality: Default::default(),
        })
    }
}

/// Reads a text file; a UTF-8 byte order mark (as some spreadsheet programs write) is dropped.
fn read(path: &Path) -> Result<String, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_owned(),
        None => text,
    })
}
