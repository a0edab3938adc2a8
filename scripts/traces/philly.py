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

import calendar
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
    jobs = []
    for line, where, field in at.csv_rows(lines, COLUMNS, name):
        report.rows += 1
        arrival = parse_time(field["timestamp"], where)
        duration = at.parse_number(field["duration"], "duration", where)
        gpus = at.parse_int(field["num_gpus"], "num_gpus", where)
        at.parse_number(field["gpu_time"], "gpu_time", where)
        vc = field["cluster"]
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
    return at.converter_main(argv, __doc__.split("\n\n")[0],
                             "path of philly.csv (Pollux artifact extract)", read_jobs,
                             prefix="philly", grouped=True)


if __name__ == "__main__":
    sys.exit(at.run(main))
