-- A round goes on without a bidder that left before its leases were granted: the engine
-- withdraws it and re-offers its share with the leftovers. Replaying the round needs to know
-- which apps those were.
ALTER TABLE rounds ADD COLUMN departed bigint[] NOT NULL DEFAULT '{}';

-- The auditor reads history and nothing else.
-- No temporary tables: TEMP is granted to PUBLIC by default; the owner keeps it.
DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END
$$;

-- No notices on the arbiter's channels (pg_notify is PUBLIC by default). The token trigger
-- notifies with its owner's right to.
REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC;
ALTER FUNCTION notify_token_changes() SECURITY DEFINER SET search_path = pg_catalog;

-- What identifies a framework's bid request for its Idempotency-Key (SHA-256 of the bid): a
-- retry with the same key must be the same request.
ALTER TABLE bids ADD COLUMN request_sha256 bytea;
