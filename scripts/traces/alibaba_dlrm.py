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

import math
import sys

import agora_trace as at

COLUMNS = ("instance_sn", "role", "app_name", "gpu_request", "creation_time", "scheduled_time",
           "deletion_time")


def read_jobs(lines, name: str, report: at.Report) -> list[at.TraceJob]:
    jobs = []
    for _, where, field in at.csv_rows(lines, COLUMNS, name):
        report.rows += 1
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
    return at.converter_main(argv, __doc__.split("\n\n")[0],
                             "path of disaggregated_DLRM_trace.csv", read_jobs,
                             prefix="dlrm", grouped=True)


if __name__ == "__main__":
    sys.exit(at.run(main))
