-- The arbiter remembers which tenant a bearer token belongs to, to spare a query per request.
-- Any change to api_tokens tells it (LISTEN agora_token_changes) to forget them all, so that a
-- deleted token stops working at once on every arbiter.
CREATE FUNCTION notify_token_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agora_token_changes', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER api_tokens_changed
    AFTER UPDATE OR DELETE OR TRUNCATE ON api_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION notify_token_changes();
