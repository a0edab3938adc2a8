-- An Idempotency-Key identifies a bid within its round: the round is part of the request
-- (`POST /v1/rounds/{round}/bids`), and an app has at most one bid per round, so the key needs
-- no uniqueness of its own. Scoping it to the round lets the arbiter accept a bid without first
-- asking the database whether its key was used in an earlier round.
ALTER TABLE bids DROP CONSTRAINT bids_app_id_idempotency_key_key;
