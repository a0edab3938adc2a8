-- Several `agora serve` processes may share this database; one leads. The leader holds a
-- session-level advisory lock on a dedicated connection (released by Postgres when that
-- session ends: a crash, a kill, a lost connection) and, on taking over, increments `epoch`
-- here. Every write transaction of the leader first reads this row FOR SHARE and writes
-- nothing unless `epoch` is still its own (the fencing token): an arbiter that lost the lock
-- and has not noticed yet can never write after its successor took over. The successor's
-- increment waits for such a transaction to end, and it restores its state only after.
CREATE TABLE leadership (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch bigint NOT NULL,
    -- The leader's URL (`advertise_url`), which standbys name when they turn writes away.
    leader_url text,
    since timestamptz
);

INSERT INTO leadership (epoch) VALUES (0);
