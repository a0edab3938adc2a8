-- An auditor reads history and nothing else (issue 17, D9).
--
-- Temporary tables: Postgres grants TEMPORARY on a database to PUBLIC, so every role, the
-- auditor included, could create them. Only the role that owns the schema (the one running
-- these migrations, the arbiter's) keeps the right.
DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO %I', current_database(), current_user);
END
$$;

-- pg_notify: any role could send on `agora_token_changes` and make the arbiter forget every
-- token it remembers. Only the arbiter's role (whose token trigger notifies) may call it. (The
-- NOTIFY statement checks no privilege in Postgres; the arbiter re-reads tokens from this
-- database on any notice, so a forged one grants nothing.)
REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO CURRENT_USER;

-- The statement timeout: Postgres lets any role set its own `statement_timeout`, and a role's
-- settings do not pass to its members, so the arbiter cancels auditors' statements that run
-- longer than `auditor_statement_timeout_ms` (services/agora-server/src/server.rs,
-- `watch_auditors`). No `ALTER ROLE agora_auditor SET ...` here: roles are shared by every
-- database of the cluster, and concurrent migrations of two databases collided on it.
