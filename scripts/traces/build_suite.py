#!/usr/bin/env python3
"""Builds the public-trace suite: sized Agora workloads and MANIFEST.md from the raw traces.

    python3 scripts/traces/build_suite.py --raw-dir RAW --out-dir OUT

RAW must hold the raw files named in SOURCES below (``raw_name``), copied byte for byte from the
source repositories at the recorded commits (docs/public-traces.md says how to obtain them);
their SHA-256 are checked. OUT receives one JSON workload per (trace, variant, cluster size)
and MANIFEST.md. Every workload is written by the converter's own command line (recorded in
the manifest) and validated.

Window rule, the same for every file (docs/public-traces.md, "Sized workloads"):

- start: the submission time of the kept job at the 10th percentile of submission times (skips
  each trace's sparse head, e.g. Philly's weeks of long jobs that predate collection);
- single-job variants are thinned to every K-th app, K = max(1, apps in the 24 h after the
  start // N), so the N apps span about one day; grouped variants take consecutive apps;
- N = 120 apps;
- arrival offsets are multiplied by the stretch that makes the mean offered load (GPU-seconds /
  arrival span) equal T = min(1.5 x C, D / 2), C the cluster's GPUs (64 or 256) and D the
  window's total GPU demand (sum of max_gpus): a window of D GPUs cannot keep more than D busy,
  and D / 2 keeps jobs from all arriving at once. Durations are not scaled (time scale 1).
- a C = 256 file is written only if its T is not demand-bound (D / 2 >= 1.5 x 256): 120 apps of
  one or two GPUs each cannot load 256 GPUs, and such a file would barely differ from the
  64-GPU one (run the 64-GPU file on 256 GPUs for a lightly loaded case).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import sys
import time
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import agora_trace as at  # noqa: E402
import alibaba_dlrm  # noqa: E402
import alibaba_openb  # noqa: E402
import philly  # noqa: E402

APPS = 120
LOAD_FACTOR = 1.5
CLUSTERS = (64, 256)
START_QUANTILE = 0.10
DAY = 86400.0

SOURCES = [
    OrderedDict(
        name="philly",
        title="Microsoft Philly (2017), Pollux artifact extract",
        module=philly, script="philly.py", prefix="philly", variants=("single", "grouped"),
        raw_name="adaptdl-philly.csv", clock="utc",
        sha256="ebffb3dd1589bdf4e7bcd74496201c5ded1d557d498ee14f560463f37ec353da",
        repo="petuum/adaptdl",
        commit="c793c7089bd307462686339d29707925c461f9a9",
        commit_note="head of branch `osdi21-artifact` (file added in de25dcc90c350b8ade3a710e437a651a8d2efae6); "
                    "snapshot HEAD (master) 542e123e50e98e4a7a7132d36c4af06c9437f6e4",
        path="simulator/traces/philly.csv",
        blob="6f73f02fb0c3eca7ea40f7031ce45a715463900e",
        license="adaptdl: Apache-2.0 (LICENSE on master; the artifact branch has none). Data: an "
                "extract of Microsoft's Philly trace (msr-fiddle/philly-traces, \"provided as is\", "
                "cite Jeon et al., ATC '19)",
    ),
    OrderedDict(
        name="alibaba-openb",
        title="Alibaba GPU cluster trace v2023 (FGD, ATC '23)",
        module=alibaba_openb, script="alibaba_openb.py", prefix="alibaba", variants=("single",),
        raw_name="alibaba-openb_pod_list_default.csv", clock="day",
        sha256="1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8",
        repo="alibaba/clusterdata",
        commit="7a6c496e4f4b6ce6150be8f881cb051bf2abff42",
        commit_note="snapshot HEAD; file added in 50a91c7c74abe3b658188dc78ac1dd302970d40c",
        path="cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv",
        blob="bd82505791c723c5b11486ef457fb338529912c0",
        license="no license file for this directory; the repository README allows any use "
                "\"for research or study purpose\" (cite Weng et al., ATC '23)",
    ),
    OrderedDict(
        name="alibaba-dlrm",
        title="Alibaba GPU trace v2025 (GPU-disaggregated DLRM serving, NSDI '25)",
        module=alibaba_dlrm, script="alibaba_dlrm.py", prefix="dlrm", variants=("single", "grouped"),
        raw_name="alibaba-disaggregated_DLRM_trace.csv", clock="day",
        sha256="fb17bc4b3f412d5280f70f04a1bdf2adfc4429d1e61237a5b106e86206414295",
        repo="alibaba/clusterdata",
        commit="7a6c496e4f4b6ce6150be8f881cb051bf2abff42",
        commit_note="snapshot HEAD; file added in 358ef992044f8393cb17d750e360cb5c26b7bdae",
        path="cluster-trace-gpu-v2025/disaggregated_DLRM_trace.csv",
        blob="299369c92aacbfea4886c81170b21fa3413cfd98",
        license="no license file for this directory; the repository README allows any use "
                "\"for research or study purpose\" (cite Yang et al., NSDI '25)",
    ),
]


def clock(kind, seconds):
    """A trace time for people: UTC for epoch times, days for trace-relative times."""
    if kind == "utc":
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds))
    return f"day {seconds / DAY:.2f}"


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read(source, path):
    report = at.Report()
    with open(path, newline="", encoding="utf-8") as handle:
        jobs = source["module"].read_jobs(handle, path, report)
    return jobs, report


def plan(jobs, variant, prefix):
    """Skip seconds and thinning factor of the window rule."""
    arrivals = sorted(job.arrival for job in jobs)
    skip = math.floor(arrivals[int(START_QUANTILE * (len(arrivals) - 1))] - arrivals[0])
    every = 1
    if variant == "single":
        everything = at.build_workload(jobs, at.Report(), prefix=prefix, variant=variant,
                                       skip_seconds=skip)
        first_day = sum(1 for app in everything["apps"] if app["arrival_seconds"] < DAY)
        every = max(1, first_day // APPS)
    return skip, every


def demand(workload):
    return sum(job["max_gpus"] for entry in workload["apps"] for job in at.jobs_of(entry))


def convert(source, raw_path, output, variant, skip, every, target):
    argv = [raw_path, "-o", output, "--skip-seconds", repr(skip), "--every", str(every),
            "--max-apps", str(APPS), "--target-load", repr(target)]
    if "grouped" in source["variants"]:
        argv += ["--variant", variant]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = at.run(source["module"].main, argv)
    if status != 0:
        raise SystemExit(f"{source['script']} failed ({status}):\n{stderr.getvalue()}")
    command = "python3 scripts/traces/{} {}".format(
        source["script"], " ".join(a if a != raw_path else f"RAW/{source['raw_name']}"
                                   for a in argv)).replace(output, "OUT/" + os.path.basename(output))
    return command, stderr.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for source in SOURCES:
        raw_path = os.path.join(args.raw_dir, source["raw_name"])
        if not os.path.exists(raw_path):
            print(f"error: {raw_path} is missing (see docs/public-traces.md)", file=sys.stderr)
            return 2
        digest = sha256(raw_path)
        if digest != source["sha256"]:
            print(f"error: {raw_path}: SHA-256 {digest}, expected {source['sha256']}",
                  file=sys.stderr)
            return 2
        jobs, report = read(source, raw_path)
        for variant in source["variants"]:
            skip, every = plan(jobs, variant, source["prefix"])
            probe_report = at.Report()
            probe = at.build_workload(jobs, probe_report, prefix=source["prefix"], variant=variant,
                                      skip_seconds=skip, every=every, max_apps=APPS)
            window = (clock(source["clock"], probe_report.window_first),
                      clock(source["clock"], probe_report.window_last))
            total_demand = demand(probe)
            for cluster in CLUSTERS:
                target = min(LOAD_FACTOR * cluster, total_demand / 2)
                if cluster != CLUSTERS[0] and target < LOAD_FACTOR * cluster:
                    print(f"{source['name']} {variant}: no c{cluster} file (demand-bound, "
                          f"T = {target:g} GPUs)", file=sys.stderr)
                    continue
                stem = f"{source['name']}-{variant}-c{cluster}"
                output = os.path.join(args.out_dir, stem + ".json")
                command, log = convert(source, raw_path, output, variant, skip, every, target)
                with open(output, encoding="utf-8") as handle:
                    workload = json.load(handle)
                problems = at.validate_workload(workload)
                if problems:
                    raise SystemExit(f"{output}: invalid: {problems[:5]}")
                stretch = [line for line in log.splitlines() if line.startswith("arrival stretch")]
                rows.append(OrderedDict(
                    file=os.path.basename(output), source=source, variant=variant,
                    cluster=cluster, target=target, demand=total_demand, skip=skip, every=every,
                    window=window,
                    stretch=stretch[0].split(":")[1].strip() if stretch else "?",
                    stats=at.stats(workload), report=report, command=command))
                print(f"wrote {output}", file=sys.stderr)
    write_manifest(os.path.join(args.out_dir, "MANIFEST.md"), rows)
    return 0


def write_manifest(path, rows):
    out = ["# Public GPU-cluster traces as Agora workloads", "",
           "Generated by `scripts/traces/build_suite.py` (docs/public-traces.md explains the "
           "conversion and the window rule). Offered load = total GPU-seconds / arrival span "
           "(first to last arrival); demand in span = mean GPUs the jobs would hold during the arrival "
           "span if each ran unqueued from its arrival (long jobs count only while the span lasts); "
           "T = target load; D = total GPU demand of the window.", "",
           "| file | trace | variant | trace window | apps | jobs | GPU-hours | span (days) "
           "| offered load (GPUs) | load / cluster | demand in span (GPUs) | D | max job (days) |",
           "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        s = row["stats"]
        out.append("| `{}` | {} | {} | {} to {} | {} | {} | {:.0f} | {:.2f} | {:.1f} | {:.2f} x {} | {:.1f} | {} | {:.1f} |".format(
            row["file"], row["source"]["name"], row["variant"], row["window"][0], row["window"][1],
            s["apps"], s["jobs"],
            s["gpu_hours"], s["span_seconds"] / DAY, s["offered_load_gpus"],
            s["offered_load_gpus"] / row["cluster"], row["cluster"], s["mean_demand_gpus"],
            row["demand"],
            s["max_job_seconds"] / DAY))
    out += ["", "## Sources", ""]
    seen = set()
    for row in rows:
        source, report = row["source"], row["report"]
        if source["name"] in seen:
            continue
        seen.add(source["name"])
        dropped = "; ".join(f"{reason}: {count}" for reason, count in sorted(report.dropped.items())) or "none"
        notes = "; ".join(f"{note}: {count}" for note, count in sorted(report.notes.items()))
        out += [f"### {source['name']}: {source['title']}", "",
                f"- repository: `{source['repo']}`, commit `{source['commit']}` ({source['commit_note']})",
                f"- file: `{source['path']}` (git blob `{source['blob']}`, SHA-256 `{source['sha256']}`)",
                f"- license / terms: {source['license']}",
                f"- rows read: {report.rows}; jobs kept: {report.kept}; dropped: {dropped}"
                + (f"; notes: {notes}" if notes else ""), ""]
    out += ["## Files", ""]
    for row in rows:
        s = row["stats"]
        out += [f"### `{row['file']}`", "",
                f"- source: {row['source']['name']} (`{row['source']['repo']}` @ `{row['source']['commit'][:12]}`, "
                f"`{row['source']['path']}`), variant {row['variant']}, sized for {row['cluster']} GPUs",
                f"- window: start skip {row['skip']:.0f} s after the first kept submission, every {row['every']}, "
                f"first {APPS} apps (submitted {row['window'][0]} to {row['window'][1]}); target load T = {row['target']:g} GPUs (D = {row['demand']}); "
                f"arrival stretch {row['stretch']}; time scale 1",
                f"- {s['apps']} apps, {s['jobs']} jobs, {s['gpu_hours']:.1f} GPU-hours, span {s['span_seconds']:.0f} s "
                f"({s['span_seconds'] / DAY:.2f} days), mean offered load {s['offered_load_gpus']:.1f} GPUs, "
                f"mean demand in span {s['mean_demand_gpus']:.1f} GPUs, "
                f"max job demand {s['max_gpus']} GPUs, median job {s['median_job_seconds']:.0f} s, "
                f"longest job {s['max_job_seconds']:.0f} s",
                f"- command: `{row['command']}`", ""]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
