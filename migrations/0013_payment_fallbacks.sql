-- Whether a winner's hidden payment fell back to the LP counterfactual: its c was computed
-- against the LP relaxation without it because the auction's budget of binary programs ran
-- out before its payment was decided exactly (docs/mechanism.md, section 3, step 7). The
-- budget is deterministic, so `agora audit replay` recomputes the same fallbacks.
ALTER TABLE round_allocations
    ADD COLUMN c_fallback boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT fallback_has_a_payment CHECK (NOT c_fallback OR c IS NOT NULL);
