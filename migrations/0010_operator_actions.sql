-- Operator actions, audited: every drain and restore of a GPU, written in the transaction that
-- makes it take effect. The admin token is the only operator credential, so the row says what
-- was done, to which GPU and when; `lease_id` is the lease given notice by a drain, if any.
CREATE TABLE operator_actions (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL,
    action   text NOT NULL CHECK (action IN ('drain', 'restore')),
    gpu_id   text NOT NULL REFERENCES gpus (id),
    lease_id bigint REFERENCES leases (id)
);

GRANT SELECT ON operator_actions TO agora_auditor;
