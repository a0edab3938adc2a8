-- GPU hosts that run `agora worker` (issue 5). A host is a machine (`machines`) with a name, in a
-- rack by name; its GPUs are `gpus` rows whose id is the CUDA UUID. What a worker reports is
-- kept in two forms: the latest state (hosts.status, worker_gpus, gpu_metrics) for the arbiter
-- and the API, and append-only event rows (host_events, gpu_health_events, lease_exits,
-- lease_violations) for auditors.

CREATE TABLE hosts (
    machine_id        integer PRIMARY KEY REFERENCES machines (id),
    name              text NOT NULL UNIQUE CHECK (name <> ''),
    rack_name         text NOT NULL CHECK (rack_name <> ''),
    worker_version    text NOT NULL,
    -- NVML's topology between every pair of the host's GPUs, as the worker sent it.
    links             jsonb NOT NULL DEFAULT '[]',
    registered_at     timestamptz NOT NULL,
    last_heartbeat_at timestamptz,
    -- 'down': the host missed two heartbeat intervals; its leases were revoked.
    status            text NOT NULL CHECK (status IN ('up', 'down'))
);

-- What NVML says about each GPU of a host. `gpus.slot` is the cluster's slot number;
-- `host_slot` is the worker's (GPUs on one NVLink or PCIe switch share one).
CREATE TABLE worker_gpus (
    gpu_id             text PRIMARY KEY REFERENCES gpus (id),
    machine_id         integer NOT NULL REFERENCES hosts (machine_id),
    name               text NOT NULL,
    memory_total_bytes bigint NOT NULL CHECK (memory_total_bytes >= 0),
    pci_bus_id         text NOT NULL,
    nvml_index         integer NOT NULL CHECK (nvml_index >= 0),
    host_slot          integer NOT NULL CHECK (host_slot >= 0),
    -- Whether the host still reports it (a re-registration may leave a GPU out).
    reported           boolean NOT NULL DEFAULT true,
    -- The worker's latest verdict; an unhealthy GPU is out of service.
    healthy            boolean NOT NULL DEFAULT true,
    health_reason      text
);

-- The latest heartbeat's metrics per GPU, named after the DCGM exporter's fields.
CREATE TABLE gpu_metrics (
    gpu_id                 text PRIMARY KEY REFERENCES worker_gpus (gpu_id),
    reported_at            timestamptz NOT NULL,
    gpu_util_percent       integer,          -- DCGM_FI_DEV_GPU_UTIL
    fb_used_mib            bigint,           -- DCGM_FI_DEV_FB_USED
    gpu_temp_celsius       integer,          -- DCGM_FI_DEV_GPU_TEMP
    power_usage_watts      double precision, -- DCGM_FI_DEV_POWER_USAGE
    ecc_sbe_volatile_total bigint,           -- DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
    ecc_dbe_volatile_total bigint,           -- DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    last_xid               bigint            -- DCGM_FI_DEV_XID_ERRORS
);

CREATE TABLE host_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine_id integer NOT NULL REFERENCES hosts (machine_id),
    at         timestamptz NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('registered', 'down', 'up')),
    reason     text
);

-- Every change of a GPU's reported health.
CREATE TABLE gpu_health_events (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    gpu_id   text NOT NULL REFERENCES worker_gpus (gpu_id),
    at       timestamptz NOT NULL,
    healthy  boolean NOT NULL,
    reason   text
);

-- A command the worker launched for a lease ended. No foreign key on the lease: the worker's
-- report is kept as sent, even for a lease id the arbiter does not know.
CREATE TABLE lease_exits (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine_id         integer NOT NULL REFERENCES hosts (machine_id),
    at                 timestamptz NOT NULL,
    lease_id           bigint NOT NULL,
    exit_code          integer,
    signal             integer,
    killed_after_grace boolean NOT NULL
);

-- A process on a GPU that did not belong to the lease holding it (or to any lease).
CREATE TABLE lease_violations (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine_id        integer NOT NULL REFERENCES hosts (machine_id),
    at                timestamptz NOT NULL,
    gpu_id            text NOT NULL,
    lease_id          bigint,
    pid               bigint NOT NULL,
    process_name      text NOT NULL,
    used_memory_bytes bigint
);

CREATE INDEX gpu_health_events_by_gpu ON gpu_health_events (gpu_id, id);
CREATE INDEX host_events_by_host ON host_events (machine_id, id);
CREATE INDEX lease_exits_by_lease ON lease_exits (lease_id);
CREATE INDEX lease_violations_by_lease ON lease_violations (lease_id);

-- How the app's leases are enforced on the hosts: {"mode": "watch"} (the app runs its jobs; the
-- worker reports foreign processes) or {"mode": "launch", "command": [...], "env": {...}}.
ALTER TABLE apps ADD COLUMN enforcement jsonb NOT NULL DEFAULT '{"mode": "watch"}';

GRANT SELECT ON hosts, worker_gpus, gpu_metrics, host_events, gpu_health_events, lease_exits,
    lease_violations TO agora_auditor;
