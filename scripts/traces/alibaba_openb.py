#!/usr/bin/env python3
"""Alibaba GPU cluster trace v2023 (FGD, USENIX ATC '23) -> Agora workload JSON.

Input: ``cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv`` of alibaba/clusterdata,
8,152 tasks (pods) of a heterogeneous production GPU cluster, one row per pod:

    name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
    openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497

Times are seconds from the start of the trace; ``num_gpu`` is the GPUs requested (0 to 8) and
``gpu_milli`` the share of each GPU (< 1000: a GPU-sharing pod, only with ``num_gpu`` = 1).

Each kept pod becomes a ``single_job`` app ``alibaba-<name>`` arriving at ``creation_time``,
with ``max_gpus`` = ``num_gpu``, run time = ``deletion_time - scheduled_time`` and work = run
time x ``num_gpu``; model ``unknown``. The trace names no user or group, so there is no grouped
variant. A GPU-sharing pod holds a whole GPU in Agora (``--fractional whole``, the default) or
is dropped (``--fractional drop``).

Dropped (counted on stderr): CPU-only pods (``num_gpu`` = 0); ``Failed`` and ``Pending`` pods;
pods never scheduled (empty ``scheduled_time``); pods still alive when the trace ends (their
``deletion_time`` is the trace's last deletion time, so their run time is cut, not known); pods
with a run time <= 0. ``Running`` pods deleted before the trace end are kept: ``Running`` is
their phase when they were deleted (stopped, not failed), so their run time ends at deletion.
"""

from __future__ import annotations

import sys

import agora_trace as at

COLUMNS = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time",
           "scheduled_time")
KEPT_PHASES = ("Succeeded", "Running")


def read_jobs(lines, name: str, report: at.Report, fractional: str = "whole",
              trace_end: float | None = None) -> list[at.TraceJob]:
    parsed = []
    for line, where, field in at.csv_rows(lines, COLUMNS, name):
        if not field["name"]:
            raise at.TraceError(f"{where}: empty name")
        gpus = at.parse_int(field["num_gpu"], "num_gpu", where)
        milli = at.parse_int(field["gpu_milli"], "gpu_milli", where) if field["gpu_milli"] else 0
        created = at.parse_number(field["creation_time"], "creation_time", where)
        deleted = at.parse_number(field["deletion_time"], "deletion_time", where)
        scheduled = (at.parse_number(field["scheduled_time"], "scheduled_time", where)
                     if field["scheduled_time"] else None)
        parsed.append((line, field["name"], gpus, milli, field["pod_phase"], created, deleted,
                       scheduled))
    report.rows = len(parsed)
    if trace_end is None:
        trace_end = max((p[6] for p in parsed), default=0.0)
    jobs = []
    for line, pod, gpus, milli, phase, created, deleted, scheduled in parsed:
        if gpus <= 0:
            report.drop("CPU-only pod (num_gpu = 0)")
            continue
        if phase not in KEPT_PHASES:
            report.drop(f"pod_phase {phase or '(empty)'}")
            continue
        if scheduled is None:
            report.drop("never scheduled (no scheduled_time)")
            continue
        if deleted >= trace_end:
            report.drop("alive at trace end (run time censored)")
            continue
        duration = deleted - scheduled
        if duration <= 0:
            report.drop("run time <= 0")
            continue
        if gpus == 1 and 0 < milli < 1000:
            if fractional == "drop":
                report.drop("GPU-sharing pod (gpu_milli < 1000), --fractional drop")
                continue
            report.notes["GPU-sharing pod counted as one whole GPU"] += 1
        report.kept += 1
        jobs.append(at.TraceJob(key=pod, arrival=created, duration=duration, gpus=gpus,
                                model="unknown", group=None))
    return jobs


def main(argv: list[str] | None = None) -> int:
    return at.converter_main(
        argv, __doc__.split("\n\n")[0], "path of openb_pod_list_default.csv", read_jobs,
        prefix="alibaba", grouped=False, add_arguments=add_arguments,
        read_options=lambda args: {"fractional": args.fractional, "trace_end": args.trace_end})


def add_arguments(parser) -> None:
    parser.add_argument("--fractional", choices=("whole", "drop"), default="whole",
                        help="GPU-sharing pods: count as one whole GPU (default) or drop")
    parser.add_argument("--trace-end", type=float, default=None,
                        help="end of the trace in seconds (default: the last deletion_time)")


if __name__ == "__main__":
    sys.exit(at.run(main))
