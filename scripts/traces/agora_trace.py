"""Shared pieces of the public-trace converters: from trace jobs to an Agora workload.

Standard library only. Each converter (``philly.py``, ``alibaba_openb.py``, ...) parses its
raw trace into ``TraceJob`` records, counting what it drops and why, and hands them to
``build_workload``, which

1. sorts the jobs by arrival (then by source key, so ties are deterministic),
2. caps each job's GPU demand at ``gpu_cap`` (the work stays ``duration x original GPUs``),
3. forms apps: one ``single_job`` app per job, or (``grouped``) one ``performance_curve`` app
   per run of jobs with the same group key submitted within ``group_window`` seconds of the
   run's first job,
4. selects a window: the apps arriving at or after ``first arrival + skip_seconds``, thinned
   to every ``every``-th one (systematic sampling; 1 keeps them all), the first ``max_apps``,
5. shifts arrivals so the first selected app arrives at 0, divides arrivals and durations by
   ``time_scale`` (offered load unchanged) and then multiplies arrivals by an arrival stretch
   (``arrival_stretch``, or the one that gives ``target_load`` GPUs of mean offered load),
6. turns each job's work (GPU-seconds) into ``total_iterations`` x ``serial_iteration_time``.

See docs/public-traces.md for the rules and the sources.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

DEFAULT_GPU_CAP = 64
DEFAULT_ITERATION_SECONDS = 1.0
DEFAULT_GROUP_WINDOW = 3600.0


class TraceError(Exception):
    """Bad input: the converter prints it and exits with status 2."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, in the trace's own time (seconds)."""

    key: str  # unique, stable id taken from the trace (used in app and job ids)
    arrival: float  # submission time, seconds (any origin)
    duration: float  # run time on `gpus` GPUs, seconds, > 0
    gpus: int  # GPUs the job held, >= 1
    model: str = "unknown"
    group: str | None = None  # user / VC / service: related jobs (HPO-like grouping)


@dataclass
class Report:
    """What a conversion kept, dropped and changed; printed to stderr."""

    rows: int = 0
    kept: int = 0
    dropped: Counter = None  # reason -> count
    notes: Counter = None  # e.g. fractional GPUs counted as whole
    capped: int = 0
    apps_total: int = 0
    apps_selected: int = 0
    jobs_selected: int = 0
    arrival_stretch: float = 1.0
    time_scale: float = 1.0
    skip_seconds: float = 0.0
    every: int = 1
    window_first: float = 0.0  # trace-time arrival of the first and last selected apps
    window_last: float = 0.0

    def __post_init__(self):
        if self.dropped is None:
            self.dropped = Counter()
        if self.notes is None:
            self.notes = Counter()

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def lines(self) -> list[str]:
        out = [f"rows read: {self.rows}", f"jobs kept: {self.kept}"]
        for reason, count in sorted(self.dropped.items()):
            out.append(f"dropped ({reason}): {count}")
        for note, count in sorted(self.notes.items()):
            out.append(f"note ({note}): {count}")
        out.append(f"jobs with GPU demand capped: {self.capped}")
        out.append(f"apps formed: {self.apps_total}")
        out.append(f"window: skip {self.skip_seconds:.0f} s, every {self.every}; trace time "
                   f"{self.window_first:.0f} s to {self.window_last:.0f} s")
        out.append(f"apps selected: {self.apps_selected} ({self.jobs_selected} jobs)")
        out.append(f"time scale (arrivals and durations divided by): {self.time_scale:g}")
        out.append(f"arrival stretch (arrival offsets multiplied by): {self.arrival_stretch:.6g}")
        return out


@dataclass
class _App:
    key: str  # app id suffix
    arrival: float
    model: str
    jobs: list  # of (job_key, duration, gpus_orig, gpus_capped)


def parse_number(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {what} `{text}` is not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: {what} `{text}` is not finite")
    return value


def parse_int(text: str, what: str, where: str) -> int:
    value = parse_number(text, what, where)
    if value != int(value):
        raise TraceError(f"{where}: {what} `{text}` is not an integer")
    return int(value)


def check_header(header: Sequence[str] | None, required: Iterable[str], where: str) -> None:
    if header is None:
        raise TraceError(f"{where}: empty file (no header)")
    names = [h.strip() for h in header]
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(
            f"{where}: bad header, missing column(s) {', '.join(missing)}; got {','.join(names)}"
        )


def csv_rows(lines, columns: Iterable[str], name: str):
    """The rows of a CSV trace with the given columns, as (line, where, {column: stripped
    field}), skipping blank lines; `where` is `name:line` for errors."""
    reader = csv.reader(lines)
    header = next(reader, None)
    check_header(header, columns, f"{name}:1")
    index = {column.strip(): i for i, column in enumerate(header)}
    for line, row in enumerate(reader, start=2):
        if not row or all(not field.strip() for field in row):
            continue
        where = f"{name}:{line}"
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, found {len(row)}")
        yield line, where, {column: row[i].strip() for column, i in index.items()}


def converter_main(argv, description: str, trace_help: str, read_jobs, prefix: str,
                   grouped: bool, add_arguments=None, read_options=None) -> int:
    """A converter's command line: parse arguments, read the trace with `read_jobs(handle,
    path, report, **read_options(args))`, build the workload and write it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("trace", help=trace_help)
    add_common_arguments(parser, grouped=grouped)
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args(argv)
    report = Report()
    with open(args.trace, newline="", encoding="utf-8") as handle:
        jobs = read_jobs(handle, args.trace, report, **(read_options(args) if read_options else {}))
    workload = build_from_args(jobs, report, args, prefix=prefix)
    return finish(workload, report, args.output)


def iterations_for(work: float, iteration_seconds: float) -> tuple[int, float]:
    """Iterations and serial iteration time with iterations x time == work (GPU-seconds)."""
    iterations = max(1, round(work / iteration_seconds))
    return iterations, work / iterations


def _form_apps(jobs: list[TraceJob], variant: str, prefix: str, gpu_cap: int,
               group_window: float, report: Report) -> list[_App]:
    apps: list[_App] = []
    open_groups: dict[str, _App] = {}
    for job in jobs:
        gpus = job.gpus
        if gpus > gpu_cap:
            gpus = gpu_cap
            report.capped += 1
        entry = (job.key, job.duration, job.gpus, gpus)
        if variant == "single" or job.group is None:
            apps.append(_App(f"{prefix}-{job.key}", job.arrival, job.model, [entry]))
            continue
        group = open_groups.get(job.group)
        if group is not None and job.arrival - group.arrival <= group_window:
            group.jobs.append(entry)
            if group.model != job.model:
                group.model = "mixed"
            continue
        group = _App(f"{prefix}-g-{job.key}", job.arrival, job.model, [entry])
        open_groups[job.group] = group
        apps.append(group)
    return apps


def build_workload(
    jobs: Iterable[TraceJob],
    report: Report,
    *,
    prefix: str,
    variant: str = "single",
    group_window: float = DEFAULT_GROUP_WINDOW,
    skip_seconds: float = 0.0,
    every: int = 1,
    max_apps: int | None = None,
    time_scale: float = 1.0,
    arrival_stretch: float | None = None,
    target_load: float | None = None,
    gpu_cap: int = DEFAULT_GPU_CAP,
    iteration_seconds: float | Callable[[str], float] = DEFAULT_ITERATION_SECONDS,
) -> dict:
    """The workload (a dict ready for json.dump) made of `jobs`; see the module docstring."""
    if variant not in ("single", "grouped"):
        raise TraceError(f"unknown variant `{variant}` (single or grouped)")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise TraceError(f"time scale must be positive, got {time_scale}")
    if arrival_stretch is not None and target_load is not None:
        raise TraceError("give either an arrival stretch or a target load, not both")
    if arrival_stretch is not None and not (arrival_stretch > 0 and math.isfinite(arrival_stretch)):
        raise TraceError(f"arrival stretch must be positive, got {arrival_stretch}")
    if target_load is not None and not (target_load > 0 and math.isfinite(target_load)):
        raise TraceError(f"target load must be positive, got {target_load}")
    if gpu_cap < 1:
        raise TraceError(f"GPU cap must be at least 1, got {gpu_cap}")
    if every < 1:
        raise TraceError(f"every must be at least 1, got {every}")
    ordered = sorted(jobs, key=lambda j: (j.arrival, j.key))
    keys = set()
    for job in ordered:
        if job.key in keys:
            raise TraceError(f"job key `{job.key}` appears twice")
        keys.add(job.key)
    apps = _form_apps(ordered, variant, prefix, gpu_cap, group_window, report)
    apps.sort(key=lambda a: (a.arrival, a.key))
    report.apps_total = len(apps)
    if not apps:
        raise TraceError("no job left after filtering")
    start = apps[0].arrival + skip_seconds
    selected = [a for a in apps if a.arrival >= start][::every]
    if max_apps is not None:
        selected = selected[:max_apps]
    if not selected:
        raise TraceError("the window selects no app (skip too long?)")
    report.apps_selected = len(selected)
    report.jobs_selected = sum(len(a.jobs) for a in selected)
    report.time_scale = time_scale
    report.skip_seconds = skip_seconds
    report.every = every
    report.window_first = selected[0].arrival
    report.window_last = selected[-1].arrival

    t0 = selected[0].arrival
    offsets = [(a.arrival - t0) / time_scale for a in selected]
    work = sum(d * g for a in selected for (_, d, g, _) in a.jobs) / time_scale
    stretch = 1.0
    if arrival_stretch is not None:
        stretch = arrival_stretch
    elif target_load is not None:
        span = offsets[-1]
        if span <= 0:
            raise TraceError("cannot target a load: all selected apps arrive together")
        stretch = (work / span) / target_load
    report.arrival_stretch = stretch

    out_apps = []
    for app, offset in zip(selected, offsets):
        t_iter = iteration_seconds(app.model) if callable(iteration_seconds) else iteration_seconds
        built = []
        for index, (_, duration, gpus_orig, gpus) in enumerate(app.jobs):
            iterations, serial = iterations_for(duration * gpus_orig / time_scale, t_iter)
            built.append(OrderedDict([
                ("id", f"{app.key}-j{index:03d}"),
                ("total_iterations", iterations),
                ("serial_iteration_time", serial),
                ("max_gpus", gpus),
            ]))
        if len(built) == 1:  # a lone job (or a group of one) is a single-job app
            body = OrderedDict([("id", app.key), ("kind", "single_job"), ("job", built[0])])
        else:
            body = OrderedDict([
                ("id", app.key),
                ("kind", "performance_curve"),
                ("jobs", [OrderedDict([("job", job),
                                       ("predicted_final_iteration", job["total_iterations"])])
                          for job in built]),
            ])
        out_apps.append(OrderedDict([
            ("arrival_seconds", offset * stretch),
            ("model", app.model),
            ("app", body),
            ("job_quality", OrderedDict()),
        ]))
    return OrderedDict([("apps", out_apps)])


# ---------------------------------------------------------------------------------------------
# Validation and statistics (also used by build_suite.py and the tests)

_APP_FIELDS = {"arrival_seconds", "model", "app", "job_quality"}
_JOB_FIELDS = {"id", "total_iterations", "completed_iterations", "serial_iteration_time",
               "max_gpus", "slowdown", "stopped"}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def validate_workload(workload) -> list[str]:
    """Problems with `workload` under Agora's JSON rules (docs/simulator-inputs.md §4)."""
    problems: list[str] = []
    if not isinstance(workload, dict) or set(workload) != {"apps"}:
        return ["top level must be an object with exactly the field `apps`"]
    if not isinstance(workload["apps"], list):
        return ["`apps` must be a list"]
    app_ids: set = set()
    job_ids: set = set()

    def check_job(job, where):
        if not isinstance(job, dict):
            problems.append(f"{where}: job must be an object")
            return
        extra = set(job) - _JOB_FIELDS
        if extra:
            problems.append(f"{where}: unknown job field(s) {sorted(extra)}")
        for need in ("id", "total_iterations", "serial_iteration_time", "max_gpus"):
            if need not in job:
                problems.append(f"{where}: job lacks `{need}`")
                return
        if not isinstance(job["id"], str) or not job["id"]:
            problems.append(f"{where}: job id must be a non-empty string")
        elif job["id"] in job_ids:
            problems.append(f"{where}: duplicate job id `{job['id']}`")
        else:
            job_ids.add(job["id"])
        if not (_is_int(job["total_iterations"]) and job["total_iterations"] >= 1):
            problems.append(f"{where}: total_iterations must be an integer >= 1")
        if not (_is_num(job["serial_iteration_time"]) and job["serial_iteration_time"] > 0):
            problems.append(f"{where}: serial_iteration_time must be finite and > 0")
        if not (_is_int(job["max_gpus"]) and job["max_gpus"] >= 1):
            problems.append(f"{where}: max_gpus must be an integer >= 1")

    for n, entry in enumerate(workload["apps"]):
        where = f"apps[{n}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be an object")
            continue
        extra = set(entry) - _APP_FIELDS
        if extra:
            problems.append(f"{where}: unknown field(s) {sorted(extra)}")
        for need in ("arrival_seconds", "model", "app"):
            if need not in entry:
                problems.append(f"{where}: lacks `{need}`")
        if "arrival_seconds" in entry and not (
                _is_num(entry["arrival_seconds"]) and entry["arrival_seconds"] >= 0):
            problems.append(f"{where}: arrival_seconds must be finite and >= 0")
        if "model" in entry and not isinstance(entry["model"], str):
            problems.append(f"{where}: model must be a string")
        quality = entry.get("job_quality", {})
        if not isinstance(quality, dict) or not all(_is_num(v) for v in quality.values()):
            problems.append(f"{where}: job_quality must map job ids to numbers")
        app = entry.get("app")
        if not isinstance(app, dict):
            problems.append(f"{where}: app must be an object")
            continue
        app_id = app.get("id")
        if not isinstance(app_id, str) or not app_id:
            problems.append(f"{where}: app id must be a non-empty string")
        elif app_id in app_ids:
            problems.append(f"{where}: duplicate app id `{app_id}`")
        else:
            app_ids.add(app_id)
        kind = app.get("kind")
        if kind == "single_job":
            extra = set(app) - {"id", "kind", "job"}
            if extra:
                problems.append(f"{where}: unknown app field(s) {sorted(extra)}")
            check_job(app.get("job"), f"{where}.job")
        elif kind == "performance_curve":
            extra = set(app) - {"id", "kind", "jobs"}
            if extra:
                problems.append(f"{where}: unknown app field(s) {sorted(extra)}")
            curve = app.get("jobs")
            if not isinstance(curve, list) or not curve:
                problems.append(f"{where}: performance_curve needs a non-empty `jobs` list")
                continue
            for m, cj in enumerate(curve):
                cw = f"{where}.jobs[{m}]"
                if not isinstance(cj, dict) or set(cj) != {"job", "predicted_final_iteration"}:
                    problems.append(f"{cw}: must have exactly `job` and `predicted_final_iteration`")
                    continue
                check_job(cj["job"], cw)
                pfi = cj["predicted_final_iteration"]
                if not _is_int(pfi) or pfi < 1:
                    problems.append(f"{cw}: predicted_final_iteration must be an integer >= 1")
                elif isinstance(cj["job"], dict) and _is_int(cj["job"].get("total_iterations")) \
                        and pfi > cj["job"]["total_iterations"]:
                    problems.append(f"{cw}: predicted_final_iteration > total_iterations")
        elif kind == "successive_halving":  # not written by the converters; accepted so that
            # validate_workload.py can check any Agora workload
            extra = set(app) - {"id", "kind", "budget_gpu_seconds", "phase_iterations",
                                "jobs_per_phase", "current_phase", "jobs"}
            if extra:
                problems.append(f"{where}: unknown app field(s) {sorted(extra)}")
            budget = app.get("budget_gpu_seconds")
            if not (_is_num(budget) and budget > 0):
                problems.append(f"{where}: budget_gpu_seconds must be positive")
            phases, per_phase = app.get("phase_iterations"), app.get("jobs_per_phase")
            if not (isinstance(phases, list) and isinstance(per_phase, list) and phases
                    and len(phases) == len(per_phase)
                    and all(_is_int(v) and v >= 0 for v in phases + per_phase)):
                problems.append(f"{where}: phase_iterations and jobs_per_phase must be "
                                "non-empty integer lists of equal length")
            halving_jobs = app.get("jobs")
            if not isinstance(halving_jobs, list) or not halving_jobs:
                problems.append(f"{where}: successive_halving needs a non-empty `jobs` list")
                continue
            for m, job in enumerate(halving_jobs):
                check_job(job, f"{where}.jobs[{m}]")
        else:
            problems.append(f"{where}: kind must be single_job, performance_curve or "
                            f"successive_halving, got {kind!r}")
    return problems


def jobs_of(entry: dict) -> list[dict]:
    app = entry["app"]
    if app["kind"] == "single_job":
        return [app["job"]]
    if app["kind"] == "successive_halving":
        return list(app["jobs"])
    return [cj["job"] for cj in app["jobs"]]


def stats(workload: dict) -> dict:
    """Apps, jobs, GPU-hours, arrival span and mean offered load (GPU-seconds / span).

    Work counts every job's configured iterations: exact for the converters' output (jobs run to
    the end), an upper bound for successive-halving apps, whose losers stop early.
    """
    apps = workload["apps"]
    jobs = [job for entry in apps for job in jobs_of(entry)]
    gpu_seconds = sum(j["total_iterations"] * j["serial_iteration_time"] for j in jobs)
    arrivals = [entry["arrival_seconds"] for entry in apps]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    durations = sorted(j["total_iterations"] * j["serial_iteration_time"] / j["max_gpus"]
                       for j in jobs)
    # Mean GPU demand over the arrival span if every job ran unqueued on max_gpus GPUs from its
    # app's arrival: long jobs count only for the part of the span they overlap.
    overlap = 0.0
    if arrivals:
        end = max(arrivals)
        for entry in apps:
            start = entry["arrival_seconds"]
            for j in jobs_of(entry):
                run = j["total_iterations"] * j["serial_iteration_time"] / j["max_gpus"]
                overlap += j["max_gpus"] * max(0.0, min(start + run, end) - start)
    return OrderedDict([
        ("apps", len(apps)),
        ("jobs", len(jobs)),
        ("gpu_hours", gpu_seconds / 3600.0),
        ("span_seconds", span),
        ("offered_load_gpus", gpu_seconds / span if span > 0 else float("inf")),
        ("mean_demand_gpus", overlap / span if span > 0 else float("inf")),
        ("max_gpus", max((j["max_gpus"] for j in jobs), default=0)),
        ("median_job_seconds", durations[len(durations) // 2] if durations else 0.0),
        ("max_job_seconds", durations[-1] if durations else 0.0),
    ])


# ---------------------------------------------------------------------------------------------
# Command line shared by the converters

def add_common_arguments(parser: argparse.ArgumentParser, *, grouped: bool) -> None:
    parser.add_argument("-o", "--output", required=True,
                        help="where to write the workload JSON (`-` for stdout)")
    if grouped:
        parser.add_argument("--variant", choices=("single", "grouped"), default="single",
                            help="single_job apps, or performance_curve apps of related jobs "
                                 "(default: single)")
        parser.add_argument("--group-window", type=float, default=DEFAULT_GROUP_WINDOW,
                            metavar="SECONDS",
                            help="grouped: a job joins its group's open app if it arrives within "
                                 "this many seconds of the app's first job (default: 3600)")
    parser.add_argument("--skip-seconds", type=float, default=0.0,
                        help="drop apps arriving in the first SECONDS of the trace (default: 0)")
    parser.add_argument("--every", type=int, default=1, metavar="K",
                        help="after the skip, keep every K-th app (systematic sampling; "
                             "default 1 = all)")
    parser.add_argument("--max-apps", type=int, default=None,
                        help="keep only the first N apps after the skip (default: all)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                        help="divide arrivals and durations by K (load unchanged; default 1)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--arrival-stretch", type=float, default=None, metavar="A",
                      help="multiply arrival offsets by A (load divided by A)")
    load.add_argument("--target-load", type=float, default=None, metavar="GPUS",
                      help="pick the arrival stretch that makes the mean offered load "
                           "(GPU-seconds / arrival span) equal GPUS")
    parser.add_argument("--gpu-cap", type=int, default=DEFAULT_GPU_CAP,
                        help="cap each job's GPU demand (work is kept; default 64)")
    parser.add_argument("--iteration-seconds", type=float, default=DEFAULT_ITERATION_SECONDS,
                        help="target serial iteration time used to pick iteration counts "
                             "(default 1.0)")


def build_from_args(jobs: list[TraceJob], report: Report, args, prefix: str) -> dict:
    if args.max_apps is not None and args.max_apps < 1:
        raise TraceError("--max-apps must be at least 1")
    if not (args.iteration_seconds > 0 and math.isfinite(args.iteration_seconds)):
        raise TraceError("--iteration-seconds must be positive")
    return build_workload(
        jobs, report, prefix=prefix,
        variant=getattr(args, "variant", "single"),
        group_window=getattr(args, "group_window", DEFAULT_GROUP_WINDOW),
        skip_seconds=args.skip_seconds, every=args.every, max_apps=args.max_apps,
        time_scale=args.time_scale, arrival_stretch=args.arrival_stretch,
        target_load=args.target_load, gpu_cap=args.gpu_cap,
        iteration_seconds=args.iteration_seconds,
    )


def dump(workload: dict, output: str) -> None:
    text = json.dumps(workload, indent=1) + "\n"
    if output == "-":
        sys.stdout.write(text)
    else:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)


def run(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Runs a converter's main, turning TraceError / unreadable files into exit status 2."""
    try:
        return main(argv)
    except TraceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def finish(workload: dict, report: Report, output: str) -> int:
    problems = validate_workload(workload)
    if problems:  # a converter bug, not bad input
        for problem in problems[:20]:
            print(f"internal error: {problem}", file=sys.stderr)
        return 1
    dump(workload, output)
    for line in report.lines():
        print(line, file=sys.stderr)
    s = stats(workload)
    print("workload: {apps} apps, {jobs} jobs, {gpu_hours:.1f} GPU-hours, span {span_seconds:.0f} s, "
          "mean offered load {offered_load_gpus:.1f} GPUs".format(**s), file=sys.stderr)
    return 0
