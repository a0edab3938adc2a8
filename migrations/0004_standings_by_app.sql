-- An app's history (its rho over time, the rounds it took part in, the "why" view) reads
-- round_standings by app.
CREATE INDEX round_standings_by_app ON round_standings (app_id, round_id);
