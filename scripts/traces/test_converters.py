"""Unit checks of the public-trace converters on tiny hand-written samples.

    python3 -m unittest scripts/traces/test_converters.py

The samples below are invented rows in each raw trace's format (not copied from the traces);
no real trace file is needed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agora_trace as at  # noqa: E402
import alibaba_dlrm  # noqa: E402
import alibaba_openb  # noqa: E402
import philly  # noqa: E402

PHILLY_CSV = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:00:00,101.0,1,101.0,aaa111
2017-10-01 00:10:00,3600.0,4,14400.0,aaa111
2017-10-01 00:05:00,50.0,0,0.0,bbb222
2017-10-01 02:00:00,0.0,2,0.0,aaa111
2017-10-01 03:00:00,7200.0,128,921600.0,bbb222
"""

OPENB_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
pod-a,8000,16384,2,1000,,LS,Succeeded,100,1100,200
pod-b,4000,8192,1,500,,BE,Running,150,2150,150
pod-c,4000,8192,0,0,,BE,Running,160,500,160
pod-d,4000,8192,1,1000,,BE,Failed,170,300,170
pod-e,4000,8192,1,1000,,LS,Pending,180,400,
pod-f,4000,8192,8,1000,,LS,Running,190,5000,195
"""

DLRM_CSV = """instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,deletion_time
inst_1,HN,app_7,12,12,1,1,25,25,120.0,120.0,680.0,800.0,8,1000.0,1010.0,4610.0
inst_2,HN,app_7,12,12,1,1,25,25,120.0,120.0,680.0,800.0,8,2000.0,2000.0,3000.0
inst_3,CN,app_7,48,48,0,0,25,25,240.0,240.0,680.0,800.0,-1,1500.0,1500.0,1600.0
inst_4,HN,app_9,12,12,1,1,25,25,120.0,120.0,680.0,800.0,8,,,5000.0
inst_5,HN,app_9,12,12,1,1,25,25,120.0,120.0,680.0,800.0,8,6000.0,6000.0,
inst_6,HN,app_9,12,12,1,1,25,25,120.0,120.0,680.0,800.0,8,9000.0,9000.0,9500.0
"""


def single(app_id, arrival, iterations, serial, gpus, model="unknown"):
    return {"arrival_seconds": arrival, "model": model,
            "app": {"id": app_id, "kind": "single_job",
                    "job": {"id": f"{app_id}-j000", "total_iterations": iterations,
                            "serial_iteration_time": serial, "max_gpus": gpus}},
            "job_quality": {}}


def curve(app_id, arrival, jobs, model="unknown"):
    return {"arrival_seconds": arrival, "model": model,
            "app": {"id": app_id, "kind": "performance_curve",
                    "jobs": [{"job": {"id": f"{app_id}-j{n:03d}", "total_iterations": it,
                                      "serial_iteration_time": serial, "max_gpus": gpus},
                              "predicted_final_iteration": it}
                             for n, (it, serial, gpus) in enumerate(jobs)]},
            "job_quality": {}}


class ConverterCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def run_converter(self, module, text, *args):
        """Runs module.main on `text`; returns (status, workload or None, stderr)."""
        raw = os.path.join(self.dir.name, "trace.csv")
        out = os.path.join(self.dir.name, "out.json")
        with open(raw, "w", encoding="utf-8") as handle:
            handle.write(text)
        if os.path.exists(out):
            os.remove(out)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            status = at.run(module.main, [raw, "-o", out, *args])
        workload = None
        if os.path.exists(out):
            with open(out, encoding="utf-8") as handle:
                workload = json.load(handle)
        return status, workload, stderr.getvalue()


class PhillyTest(ConverterCase):
    def test_single(self):
        status, workload, log = self.run_converter(philly, PHILLY_CSV, "--iteration-seconds", "2")
        self.assertEqual(status, 0, log)
        # 101 GPU-s at ~2 s/iteration: round(50.5) = 50 iterations of 2.02 s.
        self.assertEqual(workload, {"apps": [
            single("philly-r2", 0.0, 50, 2.02, 1),
            single("philly-r3", 600.0, 7200, 2.0, 4),
            single("philly-r6", 10800.0, 460800, 2.0, 64),  # 128 GPUs capped, work kept
        ]})
        self.assertIn("dropped (num_gpus <= 0): 1", log)
        self.assertIn("dropped (duration <= 0): 1", log)
        self.assertIn("jobs with GPU demand capped: 1", log)
        self.assertEqual(at.validate_workload(workload), [])

    def test_grouped_by_vc_within_an_hour(self):
        status, workload, log = self.run_converter(philly, PHILLY_CSV, "--variant", "grouped")
        self.assertEqual(status, 0, log)
        self.assertEqual(workload, {"apps": [
            curve("philly-g-r2", 0.0, [(101, 1.0, 1), (14400, 1.0, 4)]),
            single("philly-g-r6", 10800.0, 921600, 1.0, 64),
        ]})

    def test_short_group_window_splits(self):
        status, workload, _ = self.run_converter(
            philly, PHILLY_CSV, "--variant", "grouped", "--group-window", "300")
        self.assertEqual(status, 0)
        self.assertEqual([a["app"]["id"] for a in workload["apps"]],
                         ["philly-g-r2", "philly-g-r3", "philly-g-r6"])

    def test_window_and_scaling(self):
        status, workload, _ = self.run_converter(
            philly, PHILLY_CSV, "--skip-seconds", "60", "--max-apps", "1", "--time-scale", "10")
        self.assertEqual(status, 0)
        self.assertEqual(workload, {"apps": [single("philly-r3", 0.0, 1440, 1.0, 4)]})
        status, workload, _ = self.run_converter(philly, PHILLY_CSV, "--every", "2")
        self.assertEqual([a["app"]["id"] for a in workload["apps"]], ["philly-r2", "philly-r6"])
        status, workload, _ = self.run_converter(philly, PHILLY_CSV, "--arrival-stretch", "2")
        self.assertEqual([a["arrival_seconds"] for a in workload["apps"]], [0.0, 1200.0, 21600.0])

    def test_target_load(self):
        total = 101 + 14400 + 921600
        target = total / 10800 / 4  # a quarter of the natural load: stretch 4
        status, workload, log = self.run_converter(
            philly, PHILLY_CSV, "--target-load", repr(target))
        self.assertEqual(status, 0, log)
        stats = at.stats(workload)
        self.assertAlmostEqual(stats["offered_load_gpus"], target)
        self.assertAlmostEqual(workload["apps"][-1]["arrival_seconds"], 43200.0)

    def test_bad_input_exits_2(self):
        cases = {
            "timestamp,duration,num_gpus,cluster\n2017-10-01 00:00:00,1,1,a\n": "gpu_time",
            PHILLY_CSV.replace("3600.0,4", "soon,4"): "not a number",
            PHILLY_CSV.replace("2017-10-01 03:00:00", "yesterday"): "timestamp",
            PHILLY_CSV + "2017-10-02 00:00:00,1.0,1\n": "expected 5 fields",
            "": "empty file",
        }
        for text, message in cases.items():
            status, workload, log = self.run_converter(philly, text)
            self.assertEqual(status, 2, text)
            self.assertIsNone(workload)
            self.assertIn(message, log)

    def test_missing_file_exits_2(self):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            status = at.run(philly.main, [os.path.join(self.dir.name, "nope.csv"), "-o", "-"])
        self.assertEqual(status, 2)
        self.assertIn("error:", stderr.getvalue())


class AlibabaOpenbTest(ConverterCase):
    def test_kept_and_dropped(self):
        status, workload, log = self.run_converter(alibaba_openb, OPENB_CSV)
        self.assertEqual(status, 0, log)
        self.assertEqual(workload, {"apps": [
            single("alibaba-pod-a", 0.0, 1800, 1.0, 2),  # 900 s on 2 GPUs
            single("alibaba-pod-b", 50.0, 2000, 1.0, 1),  # half a GPU, counted whole
        ]})
        for line in ("dropped (CPU-only pod (num_gpu = 0)): 1", "dropped (pod_phase Failed): 1",
                     "dropped (pod_phase Pending): 1",
                     "dropped (alive at trace end (run time censored)): 1",
                     "note (GPU-sharing pod counted as one whole GPU): 1", "jobs kept: 2"):
            self.assertIn(line, log)

    def test_fractional_drop_and_trace_end(self):
        status, workload, log = self.run_converter(
            alibaba_openb, OPENB_CSV, "--fractional", "drop", "--trace-end", "6000")
        self.assertEqual(status, 0, log)
        self.assertEqual(workload, {"apps": [
            single("alibaba-pod-a", 0.0, 1800, 1.0, 2),
            single("alibaba-pod-f", 90.0, 38440, 1.0, 8),  # no longer censored
        ]})

    def test_bad_input_exits_2(self):
        status, workload, log = self.run_converter(
            alibaba_openb, OPENB_CSV.replace(",2,1000,,LS,Succeeded", ",two,1000,,LS,Succeeded"))
        self.assertEqual((status, workload), (2, None))
        self.assertIn("num_gpu `two`", log)
        status, _, log = self.run_converter(alibaba_openb, OPENB_CSV.replace("pod_phase", "phase"))
        self.assertEqual(status, 2)
        self.assertIn("pod_phase", log)


class AlibabaDlrmTest(ConverterCase):
    def test_single(self):
        status, workload, log = self.run_converter(alibaba_dlrm, DLRM_CSV)
        self.assertEqual(status, 0, log)
        self.assertEqual(workload, {"apps": [
            single("dlrm-inst_1", 0.0, 3600, 1.0, 1, "dlrm"),
            single("dlrm-inst_2", 1000.0, 1000, 1.0, 1, "dlrm"),
            single("dlrm-inst_6", 8000.0, 500, 1.0, 1, "dlrm"),
        ]})
        for line in ("dropped (CPU-only instance (gpu_request = 0)): 1",
                     "dropped (created before the trace (no creation/scheduled time)): 1",
                     "dropped (alive at trace end (no deletion_time)): 1", "jobs kept: 3"):
            self.assertIn(line, log)

    def test_grouped_by_service(self):
        status, workload, log = self.run_converter(alibaba_dlrm, DLRM_CSV, "--variant", "grouped")
        self.assertEqual(status, 0, log)
        self.assertEqual(workload, {"apps": [
            curve("dlrm-g-inst_1", 0.0, [(3600, 1.0, 1), (1000, 1.0, 1)], "dlrm"),
            single("dlrm-g-inst_6", 8000.0, 500, 1.0, 1, "dlrm"),
        ]})

    def test_bad_input_exits_2(self):
        status, workload, log = self.run_converter(alibaba_dlrm, DLRM_CSV.replace("9500.0", "late"))
        self.assertEqual((status, workload), (2, None))
        self.assertIn("deletion_time `late`", log)


class ValidatorTest(unittest.TestCase):
    def test_catches_rule_breaks(self):
        good = {"apps": [single("a", 0.0, 10, 1.0, 1), curve("b", 5.0, [(3, 0.5, 2)])]}
        self.assertEqual(at.validate_workload(good), [])
        bad = json.loads(json.dumps(good))
        bad["apps"][0]["extra"] = 1
        bad["apps"][1]["app"]["jobs"][0]["predicted_final_iteration"] = 4
        bad["apps"][1]["app"]["id"] = "a"
        bad["apps"][0]["app"]["job"]["max_gpus"] = 0
        problems = " | ".join(at.validate_workload(bad))
        for expected in ("unknown field", "predicted_final_iteration > total_iterations",
                         "duplicate app id", "max_gpus"):
            self.assertIn(expected, problems)


if __name__ == "__main__":
    unittest.main()
