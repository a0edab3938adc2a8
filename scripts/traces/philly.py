#!/usr/bin/env python3
"""Microsoft Philly jobs (2017) -> Agora workload JSON.

Input: the Philly extract shipped with the Pollux (OSDI '21) artifact,
``simulator/traces/philly.csv`` of petuum/adaptdl (branch ``osdi21-artifact``), one row per job:

    timestamp,duration,num_gpus,gpu_time,cluster
    2017-10-09 07:01:55,66.0,1,66.0,11cb48

- ``timestamp``: submission time, ``YYYY-MM-DD HH:MM:SS`` (read as UTC);
- ``duration``: run time in seconds on ``num_gpus`` GPUs; ``gpu_time`` = duration x GPUs;
- ``cluster``: the Philly virtual cluster (VC, one team's share of the cluster).

Each kept job becomes a ``single_job`` app ``philly-r<line>`` (``line`` is the job's line in
the CSV, header = line 1), model ``unknown`` (the trace has none), work = duration x GPUs.
``--variant grouped`` makes one ``performance_curve`` app of the jobs of one VC submitted
within ``--group-window`` seconds (default 1 h) of the app's first job: the extract has no user
field, so the VC is the closest notion of "related jobs" it has (see docs/public-traces.md).

Dropped: rows with ``num_gpus`` <= 0 and rows with ``duration`` <= 0. The extract has no job
status column, so failed or killed jobs cannot be told apart. Malformed rows are errors (exit 2).
"""

from __future__ import annotations

import argparse
import calendar
import csv
import sys
import time

import agora_trace as at

COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


def parse_time(text: str, where: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")))
    except ValueError:
        raise at.TraceError(f"{where}: timestamp `{text}` is not YYYY-MM-DD HH:MM:SS") from None


def read_jobs(lines, name: str, report: at.Report) -> list[at.TraceJob]:
    reader = csv.reader(lines)
    header = next(reader, None)
    at.check_header(header, COLUMNS, f"{name}:1")
    index = {column.strip(): i for i, column in enumerate(header)}
    jobs = []
    for line, row in enumerate(reader, start=2):
        if not row or all(not field.strip() for field in row):
            continue
        where = f"{name}:{line}"
        if len(row) != len(header):
            raise at.TraceError(f"{where}: expected {len(header)} fields, found {len(row)}")
        report.rows += 1
        arrival = parse_time(row[index["timestamp"]], where)
        duration = at.parse_number(row[index["duration"]], "duration", where)
        gpus = at.parse_int(row[index["num_gpus"]], "num_gpus", where)
        at.parse_number(row[index["gpu_time"]], "gpu_time", where)
        vc = row[index["cluster"]].strip()
        if not vc:
            raise at.TraceError(f"{where}: empty cluster (VC)")
        if gpus <= 0:
            report.drop("num_gpus <= 0")
            continue
        if duration <= 0:
            report.drop("duration <= 0")
            continue
        report.kept += 1
        jobs.append(at.TraceJob(key=f"r{line}", arrival=arrival, duration=duration, gpus=gpus,
                                model="unknown", group=f"vc-{vc}"))
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="path of philly.csv (Pollux artifact extract)")
    at.add_common_arguments(parser, grouped=True)
    args = parser.parse_args(argv)
    report = at.Report()
    with open(args.trace, newline="", encoding="utf-8") as handle:
        jobs = read_jobs(handle, args.trace, report)
    workload = at.build_from_args(jobs, report, args, prefix="philly")
    return at.finish(workload, report, args.output)


if __name__ == "__main__":
    sys.exit(at.run(main))
