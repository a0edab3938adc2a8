//! `agora audit replay`: recompute stored rounds with the engine and compare.

use agora_server::ids::RoundId;
use anyhow::bail;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute rounds from their stored inputs and check the stored outcomes match exactly.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The round to replay.
    #[arg(long, conflicts_with = "all", required_unless_present = "all")]
    round: Option<i64>,
    /// Replay every closed round.
    #[arg(long)]
    all: bool,
    /// The database (default: $DATABASE_URL, else the local `agora` database). Read only: a
    /// role with the `agora_auditor` rights is enough.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/agora"
    )]
    database_url: String,
}

impl AuditCommand {
    pub fn run(self) -> anyhow::Result<()> {
        let Self::Replay(args) = self;
        actix_web::rt::System::new().block_on(args.replay())
    }
}

impl ReplayArgs {
    async fn replay(self) -> anyhow::Result<()> {
        let store =
            agora_server::store::Store::connect_without_migrating(&self.database_url).await?;
        let rounds = match self.round {
            Some(round) => vec![RoundId(round)],
            None => store.closed_round_ids().await?,
        };
        let mut mismatched = 0;
        for round in &rounds {
            let replay = agora_server::audit::replay_round(&store, *round).await?;
            if replay.matches {
                println!("round {round}: matches");
            } else {
                mismatched += 1;
                println!("round {round}: DIFFERS");
                for difference in &replay.differences {
                    println!("  {difference}");
                }
            }
        }
        if mismatched > 0 {
            bail!(
                "{mismatched} of {} rounds differ from their replay",
                rounds.len()
            );
        }
        println!("{} rounds replayed, all match", rounds.len());
        Ok(())
    }
}
