-- Heterogeneous GPUs in the live service (issue 21). Hosts report each GPU's CUDA compute
-- capability beside its NVML product name, and the arbiter maps the name to the engine's GPU
-- type (`agora_market::gpu_models`: `NVIDIA H100 80GB HBM3` is `h100`), which `gpus.gpu_type`
-- holds for worker GPUs from now on. GPUs a host registered before this migration keep what
-- was stored then, the product name, as their type.
ALTER TABLE worker_gpus ADD COLUMN compute_capability text
    CHECK (compute_capability ~ '^[0-9]+\.[0-9]+$');

-- Throughput a framework measured for an app on a GPU type (`POST /v1/apps/{app}/throughput`):
-- each report as accepted, with the app's table after it. The table the engine uses now is
-- part of the app's state (`apps.state`).
CREATE TABLE throughput_reports (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    app_id      bigint NOT NULL REFERENCES apps (id),
    reported_at timestamptz NOT NULL,
    gpu_type    text NOT NULL CHECK (gpu_type <> ''),
    speed       double precision NOT NULL CHECK (speed > 0 AND speed < 'Infinity'),
    throughput  jsonb NOT NULL
);

CREATE INDEX throughput_reports_by_app ON throughput_reports (app_id, id);

GRANT SELECT ON throughput_reports TO agora_auditor;
