#!/usr/bin/env python3
"""Checks Agora workload JSON files against the format's rules and prints their statistics.

    python3 scripts/traces/validate_workload.py FILE.json [FILE.json ...]

Rules (docs/simulator-inputs.md §4): no unknown fields; unique app and job ids; arrivals finite
and >= 0; total_iterations and max_gpus integers >= 1; serial_iteration_time finite and > 0;
predicted_final_iteration <= total_iterations; successive-halving plans well formed. Exit
status 1 if any file breaks a rule, 2 if a file cannot be read or parsed. The statistics count
every job's configured iterations (an upper bound for successive-halving apps).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agora_trace as at  # noqa: E402


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                workload = json.load(handle)
        except (OSError, ValueError) as error:
            print(f"{path}: cannot read: {error}", file=sys.stderr)
            status = 2
            continue
        problems = at.validate_workload(workload)
        if problems:
            status = max(status, 1)
            for problem in problems[:20]:
                print(f"{path}: {problem}", file=sys.stderr)
            continue
        s = at.stats(workload)
        print(f"{path}: ok: {s['apps']} apps, {s['jobs']} jobs, {s['gpu_hours']:.1f} GPU-hours, "
              f"span {s['span_seconds']:.0f} s, mean offered load {s['offered_load_gpus']:.1f} GPUs")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
