-- CPUs and memory in the live service (issue 24, Synergy). Hosts report their CPU cores and
-- memory (RAM, not GPU memory) when they register; absent, the host's CPUs or memory are not
-- modelled, as before. After every round the engine divides each modelled machine's CPUs and
-- memory among the apps holding its GPUs, and an app's share on a machine among its leases
-- there by GPUs.
ALTER TABLE hosts
    ADD COLUMN cpus integer CHECK (cpus > 0),
    ADD COLUMN memory_gib double precision CHECK (memory_gib > 0 AND memory_gib < 'Infinity');

-- The CPUs and memory of each lease (summed over its machines; NULL where a machine of the lease
-- does not model the resource), one row per lease and round that set or changed them: the round
-- that granted the lease, then every later round whose division gave it other amounts. What a
-- lease had at time t is its latest row with `at <= t`. Leases on machines that model neither
-- resource have no rows.
CREATE TABLE lease_resources (
    lease_id   bigint NOT NULL REFERENCES leases (id),
    round_id   bigint NOT NULL REFERENCES rounds (id),
    at         timestamptz NOT NULL,
    cpus       double precision CHECK (cpus >= 0 AND cpus < 'Infinity'),
    memory_gib double precision CHECK (memory_gib >= 0 AND memory_gib < 'Infinity'),
    PRIMARY KEY (lease_id, round_id)
);

GRANT SELECT ON lease_resources TO agora_auditor;
