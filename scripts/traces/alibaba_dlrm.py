#!/usr/bin/env python3
"""Alibaba GPU trace v2025 (GPU-disaggregated DLRM serving, NSDI '25) -> Agora workload JSON.

Input: ``cluster-trace-gpu-v2025/disaggregated_DLRM_trace.csv`` of alibaba/clusterdata,
23,871 inference instances of 156 services, one row per instance:

    instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,...,creation_time,scheduled_time,deletion_time
    instance_13574,CN,app_130,64,64,0,0,1,1,320.0,320.0,255.0,300.0,-1,1435629.0,1435629.0,1435760.0

``role`` is ``HN`` (GPU node instance) or ``CN`` (CPU node instance); times are seconds from
the start of the trace, empty when the instance was created before the trace started or deleted
after it ended.

This is a SERVING workload (long-lived inference instances that are scaled out and in), not
training: it is in the suite as a contrast, a real GPU cluster whose "jobs" are service
instances. Each kept instance becomes a ``single_job`` app ``dlrm-<instance_sn>`` arriving at
``creation_time``, ``max_gpus`` = ``gpu_request``, run time = ``deletion_time -
scheduled_time``, work = run time x GPUs, model ``dlrm``. ``--variant grouped`` makes one
``performance_curve`` app of the instances of one service (``app_name``) created within
``--group-window`` seconds (default 1 h) of the app's first instance (a scale-out burst).

Dropped (counted on stderr): CPU-only instances (``gpu_request`` = 0); instances without a
``creation_time`` or ``scheduled_time`` (they predate the trace: their start is unknown);
instances without a ``deletion_time`` (alive at the trace end: run time censored); run time
<= 0. A fractional ``gpu_request`` would be rounded up (none in the released file).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys

import agora_trace as at

COLUMNS = ("instance_sn", "role", "app_name", "gpu_request", "creation_time", "scheduled_time",
           "deletion_time")


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
        field = {column: row[i].strip() for column, i in index.items()}
        if not field["instance_sn"] or not field["app_name"]:
            raise at.TraceError(f"{where}: empty instance_sn or app_name")
        gpus_raw = at.parse_number(field["gpu_request"], "gpu_request", where)
        times = {}
        for column in ("creation_time", "scheduled_time", "deletion_time"):
            text = field[column]
            times[column] = (at.parse_number(text, column, where)
                             if text and text.lower() != "nan" else None)
        if gpus_raw <= 0:
            report.drop("CPU-only instance (gpu_request = 0)")
            continue
        if times["creation_time"] is None or times["scheduled_time"] is None:
            report.drop("created before the trace (no creation/scheduled time)")
            continue
        if times["deletion_time"] is None:
            report.drop("alive at trace end (no deletion_time)")
            continue
        duration = times["deletion_time"] - times["scheduled_time"]
        if duration <= 0:
            report.drop("run time <= 0")
            continue
        gpus = math.ceil(gpus_raw)
        if gpus != gpus_raw:
            report.notes["fractional gpu_request rounded up"] += 1
        report.kept += 1
        jobs.append(at.TraceJob(key=field["instance_sn"], arrival=times["creation_time"],
                                duration=duration, gpus=gpus, model="dlrm",
                                group=f"svc-{field['app_name']}"))
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="path of disaggregated_DLRM_trace.csv")
    at.add_common_arguments(parser, grouped=True)
    args = parser.parse_args(argv)
    report = at.Report()
    with open(args.trace, newline="", encoding="utf-8") as handle:
        jobs = read_jobs(handle, args.trace, report)
    workload = at.build_from_args(jobs, report, args, prefix="dlrm")
    return at.finish(workload, report, args.output)


if __name__ == "__main__":
    sys.exit(at.run(main))
