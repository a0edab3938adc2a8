-- Apps of a round's standings that left the market (finished or withdrawn) before the round was
-- decided: their bids were withdrawn and they received nothing (their share went to the others).
-- Part of a round's recorded inputs, so that `agora audit replay` decides it as the arbiter did.
ALTER TABLE rounds ADD COLUMN departed bigint[] NOT NULL DEFAULT '{}';
