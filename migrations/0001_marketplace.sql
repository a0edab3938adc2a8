-- Agora's history: tenants, apps, the cluster, every round with every input needed to replay
-- it, every bid row, every outcome, and every lease with its events. Times are timestamptz with
-- millisecond values (the engine's clock resolution).

-- btree_gist lets one exclusion constraint combine GPU equality with time-range overlap.
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE tenants (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL UNIQUE CHECK (name <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Only the SHA-256 of a token is stored; the token itself is shown once, at creation.
CREATE TABLE api_tokens (
    token_sha256 bytea PRIMARY KEY CHECK (length(token_sha256) = 32),
    tenant_id    bigint NOT NULL REFERENCES tenants (id),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE apps (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    bigint NOT NULL REFERENCES tenants (id),
    name         text NOT NULL CHECK (name <> ''),
    kind         text NOT NULL CHECK (kind IN ('single_job', 'successive_halving', 'performance_curve')),
    -- 'agent': the arbiter's agent bids from the reported progress; 'explicit': the framework bids.
    bidding      text NOT NULL CHECK (bidding IN ('agent', 'explicit')),
    -- The engine's view of the app (jobs, progress, observed slowdowns), kept current.
    state        jsonb NOT NULL,
    arrived_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    UNIQUE (tenant_id, name)
);

CREATE TABLE jobs (
    app_id                bigint NOT NULL REFERENCES apps (id),
    name                  text NOT NULL,
    total_iterations      bigint NOT NULL CHECK (total_iterations > 0),
    serial_iteration_time double precision NOT NULL CHECK (serial_iteration_time > 0),
    max_gpus              integer NOT NULL CHECK (max_gpus > 0),
    completed_iterations  bigint NOT NULL DEFAULT 0,
    stopped               boolean NOT NULL DEFAULT false,
    PRIMARY KEY (app_id, name)
);

CREATE TABLE job_progress (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    app_id                bigint NOT NULL,
    job                   text NOT NULL,
    reported_at           timestamptz NOT NULL,
    completed_iterations  bigint NOT NULL,
    stopped               boolean NOT NULL,
    -- An observed iteration time and where it was measured, when the framework sent one.
    observed_locality     text,
    observed_slowdown     double precision,
    FOREIGN KEY (app_id, job) REFERENCES jobs (app_id, name)
);

CREATE TABLE machines (
    id    integer PRIMARY KEY,
    rack  integer NOT NULL,
    host  text NOT NULL
);

CREATE TABLE gpus (
    id         text PRIMARY KEY,
    machine_id integer NOT NULL REFERENCES machines (id),
    slot       integer NOT NULL,
    gpu_type   text NOT NULL,
    cuda_uuid  text NOT NULL UNIQUE,
    healthy    boolean NOT NULL DEFAULT true
);

CREATE TABLE rounds (
    id              bigint PRIMARY KEY,
    opened_at       timestamptz NOT NULL,
    deadline        timestamptz NOT NULL,
    closed_at       timestamptz,
    status          text NOT NULL CHECK (status IN ('open', 'closed', 'abandoned')),
    policy          text NOT NULL,
    fairness_knob   double precision NOT NULL,
    lease_seconds   double precision NOT NULL,
    leftover_policy text NOT NULL,
    -- Stored as the decimal text of the engine's u64 seed.
    seed            numeric(20, 0) NOT NULL,
    engine_version  text NOT NULL,
    -- The engine's replay inputs (offer with topology, standings, holdings), exactly.
    offer           jsonb NOT NULL,
    standings       jsonb NOT NULL,
    holds           jsonb NOT NULL,
    -- GPUs offered that no bidder kept and no leftover grant used (set when closed).
    unallocated     text[]
);

-- Every active app at the round's start, worst rho first; `bidder` marks the offered ones.
CREATE TABLE round_standings (
    round_id     bigint NOT NULL REFERENCES rounds (id),
    position     integer NOT NULL,
    app_id       bigint NOT NULL REFERENCES apps (id),
    rho          double precision, -- NULL: starving (holds no GPU)
    unmet_demand integer NOT NULL,
    bidder       boolean NOT NULL,
    PRIMARY KEY (round_id, app_id),
    UNIQUE (round_id, position)
);

CREATE TABLE bids (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    round_id        bigint NOT NULL REFERENCES rounds (id),
    app_id          bigint NOT NULL REFERENCES apps (id),
    -- 'framework': posted over HTTP; 'agent': computed by the arbiter's agent for the app.
    source          text NOT NULL CHECK (source IN ('framework', 'agent')),
    rho_old         double precision, -- NULL: starving
    idempotency_key text,
    received_at     timestamptz NOT NULL,
    UNIQUE (round_id, app_id),
    UNIQUE (app_id, idempotency_key)
);

CREATE TABLE bid_entries (
    bid_id  bigint NOT NULL REFERENCES bids (id),
    entry   integer NOT NULL,
    gpus    text[] NOT NULL CHECK (cardinality(gpus) > 0),
    rho     double precision NOT NULL CHECK (rho > 0 AND rho < 'Infinity'),
    PRIMARY KEY (bid_id, entry)
);

-- What each app got in a closed round: its PF choice and payment (bidders) and its grants.
CREATE TABLE round_allocations (
    round_id       bigint NOT NULL REFERENCES rounds (id),
    app_id         bigint NOT NULL REFERENCES apps (id),
    pf_entry       integer,          -- index into the app's bid table; NULL: PF gave it nothing
    pf_gpus        text[] NOT NULL DEFAULT '{}',
    c              double precision CHECK (c > 0 AND c <= 1), -- hidden-payment share; bidders only
    kept_gpus      text[] NOT NULL DEFAULT '{}', -- from the auction
    leftover_gpus  text[] NOT NULL DEFAULT '{}', -- handed out after the auction
    PRIMARY KEY (round_id, app_id)
);

CREATE TABLE leases (
    id        bigint PRIMARY KEY,
    app_id    bigint NOT NULL REFERENCES apps (id),
    round_id  bigint NOT NULL REFERENCES rounds (id),
    gpus      text[] NOT NULL CHECK (cardinality(gpus) > 0),
    start_at  timestamptz NOT NULL,
    end_at    timestamptz NOT NULL CHECK (end_at > start_at),
    state     text NOT NULL CHECK (state IN ('active', 'expired', 'released', 'revoked')),
    ended_at  timestamptz,
    CHECK ((state = 'active') = (ended_at IS NULL))
);

-- One row per GPU of a lease, over the time it is (or was) held. The exclusion constraint makes
-- two leases that hold one GPU at overlapping times impossible, whatever the code does.
CREATE TABLE lease_gpus (
    lease_id bigint NOT NULL REFERENCES leases (id),
    gpu_id   text NOT NULL REFERENCES gpus (id),
    held     tstzrange NOT NULL,
    PRIMARY KEY (lease_id, gpu_id),
    EXCLUDE USING gist (gpu_id WITH =, held WITH &&)
);

CREATE TABLE lease_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lease_id  bigint NOT NULL REFERENCES leases (id),
    at        timestamptz NOT NULL,
    kind      text NOT NULL CHECK (kind IN ('granted', 'expired', 'released', 'revoked', 'revocation_notice')),
    reason    text
);

-- What each app is told (offers, round results, lease changes), in order: the SSE stream and the
-- long-poll read from here, so a client that reconnects misses nothing.
CREATE TABLE app_events (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    app_id   bigint NOT NULL REFERENCES apps (id),
    at       timestamptz NOT NULL,
    kind     text NOT NULL,
    payload  jsonb NOT NULL
);
CREATE INDEX app_events_by_app ON app_events (app_id, id);
CREATE INDEX leases_by_app ON leases (app_id, id);
CREATE INDEX active_leases ON leases (id) WHERE state = 'active';
CREATE INDEX bids_by_app ON bids (app_id, round_id);
