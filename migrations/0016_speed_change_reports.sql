-- Jobs whose speed changes as they train (issue 24, Shockwave's half). A framework that scales
-- a job's batch size mid-run reports the change (`POST /v1/apps/{app}/speed-changes`): each
-- report as accepted, with the job's schedule after it. The schedule the engine uses now is
-- part of the app's state (`apps.state`), which a restart restores.
CREATE TABLE speed_change_reports (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    app_id                bigint NOT NULL,
    job                   text NOT NULL,
    reported_at           timestamptz NOT NULL,
    -- The first round whose rho and agent bids use the report: the next round to open when it
    -- was accepted (a round open then already ranked the apps and asked for their bids).
    first_round           bigint NOT NULL CHECK (first_round > 0),
    at_iteration          bigint NOT NULL CHECK (at_iteration > 0),
    serial_iteration_time double precision NOT NULL
        CHECK (serial_iteration_time > 0 AND serial_iteration_time < 'Infinity'),
    -- The job's speed changes after the report (`[{"at_iteration", "serial_iteration_time"}]`).
    speed_changes         jsonb NOT NULL,
    FOREIGN KEY (app_id, job) REFERENCES jobs (app_id, name)
);

CREATE INDEX speed_change_reports_by_app ON speed_change_reports (app_id, id);

GRANT SELECT ON speed_change_reports TO agora_auditor;
