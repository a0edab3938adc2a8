-- Auditors: a read-only role and views over the history (docs/auditing.md has example queries).

DO $$
BEGIN
    -- Roles belong to the whole Postgres cluster, not one database: create it once.
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'agora_auditor') THEN
        CREATE ROLE agora_auditor NOLOGIN;
    END IF;
END
$$;

-- One row per round: what was offered, to how many, and where the GPUs went.
CREATE VIEW round_summary AS
SELECT r.id AS round_id,
       r.opened_at,
       r.closed_at,
       r.status,
       r.policy,
       r.fairness_knob,
       r.seed,
       r.engine_version,
       jsonb_array_length(r.offer -> 'gpus') AS offered_gpus,
       (SELECT count(*) FROM round_standings s WHERE s.round_id = r.id AND s.bidder) AS bidders,
       (SELECT count(*) FROM bids b WHERE b.round_id = r.id) AS bids,
       (SELECT coalesce(sum(cardinality(a.kept_gpus)), 0)
          FROM round_allocations a WHERE a.round_id = r.id) AS gpus_won_in_auction,
       (SELECT coalesce(sum(cardinality(a.leftover_gpus)), 0)
          FROM round_allocations a WHERE a.round_id = r.id) AS gpus_as_leftovers,
       cardinality(r.unallocated) AS gpus_unallocated
  FROM rounds r;

-- Every row of every bid table, with whether the PF choice picked it.
CREATE VIEW bid_history AS
SELECT b.round_id,
       t.name AS tenant,
       a.id AS app_id,
       a.name AS app,
       b.source,
       b.received_at,
       b.rho_old,
       e.entry,
       e.gpus,
       e.rho,
       coalesce(al.pf_entry = e.entry, false) AS pf_choice,
       al.c
  FROM bids b
  JOIN bid_entries e ON e.bid_id = b.id
  JOIN apps a ON a.id = b.app_id
  JOIN tenants t ON t.id = a.tenant_id
  LEFT JOIN round_allocations al ON al.round_id = b.round_id AND al.app_id = b.app_id;

-- Every lease, with how long it was held and the GPU time it gave.
CREATE VIEW lease_history AS
SELECT l.id AS lease_id,
       t.name AS tenant,
       a.id AS app_id,
       a.name AS app,
       l.round_id,
       l.gpus,
       l.start_at,
       l.end_at,
       l.state,
       l.ended_at,
       extract(epoch FROM coalesce(l.ended_at, l.end_at) - l.start_at)
           * cardinality(l.gpus) AS gpu_seconds
  FROM leases l
  JOIN apps a ON a.id = l.app_id
  JOIN tenants t ON t.id = a.tenant_id;

-- Each app's rho at the start of every round it was active in (NULL rho: starving).
CREATE VIEW app_fairness AS
SELECT r.id AS round_id,
       r.opened_at AS at,
       t.name AS tenant,
       a.id AS app_id,
       a.name AS app,
       s.rho,
       s.position,
       s.bidder
  FROM round_standings s
  JOIN rounds r ON r.id = s.round_id
  JOIN apps a ON a.id = s.app_id
  JOIN tenants t ON t.id = a.tenant_id;

GRANT USAGE ON SCHEMA public TO agora_auditor;
GRANT SELECT ON round_summary, bid_history, lease_history, app_fairness TO agora_auditor;
-- The raw history too, for queries the views do not cover; never the API tokens.
GRANT SELECT ON tenants, apps, jobs, job_progress, machines, gpus, rounds, round_standings,
    bids, bid_entries, round_allocations, leases, lease_gpus, lease_events TO agora_auditor;
