-- T_cluster, an app's finish time alone on the whole cluster, is fixed when the app arrives:
-- it is the denominator of the app's rho for the rest of its life, so a restart must restore it
-- exactly rather than recompute it on a cluster (or an app state) that has changed since.
-- Apps registered before this column existed have NULL; the arbiter recomputes theirs at start.
ALTER TABLE apps
    ADD COLUMN cluster_seconds double precision CHECK (cluster_seconds > 0);

COMMENT ON COLUMN apps.cluster_seconds IS
    'T_cluster in seconds: the app''s finish time holding every GPU of the cluster, under the engine''s job model, computed on arrival';

-- The GPUs each app's lease had just ended on when a round was decided: the app may renew onto
-- them (leftovers return them first), so a round's replay needs them. '{}' for older rounds,
-- which were decided without claims.
ALTER TABLE rounds
    ADD COLUMN claims jsonb NOT NULL DEFAULT '{}'::jsonb;

COMMENT ON COLUMN rounds.claims IS
    'Replay input: app id -> offered GPU ids whose lease that app held until the round';
