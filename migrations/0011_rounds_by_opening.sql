-- The dashboard's history reads rounds by time (GET /v1/fairness/history, rho-history?range=).
CREATE INDEX rounds_by_opening ON rounds (opened_at);
