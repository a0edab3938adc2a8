-- What each round divided the machines' CPUs and memory from (issue 24): every divided machine
-- with its holders and their profiles, and every active lease's GPUs per machine
-- (`agora_market::division::DivisionRecord` as JSON). `agora audit replay` divides again from
-- it and checks each lease's `lease_resources` as of the round. NULL on a cluster that models
-- neither resource, and for rounds closed before this migration.
ALTER TABLE rounds ADD COLUMN resource_division jsonb;
