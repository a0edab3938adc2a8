-- Whether an app's PF choice is the best found within the PF programs' budget of
-- branch-and-bound nodes rather than a proved optimum: set for every bidder of a conflict
-- component whose program ran out (docs/mechanism.md, section 3, step 2). Such a component's
-- payments all fall back to the LP counterfactual, so the flag implies `c_fallback` for its
-- paying winners. The budget counts nodes, not seconds: `agora audit replay` recomputes it.
ALTER TABLE round_allocations ADD COLUMN pf_fallback boolean NOT NULL DEFAULT false;
