//! Bearer tokens already looked up, so that a busy framework's requests do not each cost a
//! query. A token is remembered only while the service listens to the database's notices of
//! token changes (the trigger of migration 0006): any change forgets every remembered token,
//! so a token deleted from `api_tokens` stops working as soon as its notice arrives. While not
//! listening (before the first `LISTEN`, after a lost connection) nothing is remembered and
//! every request asks the database.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgNotification};
use tokio::sync::watch;

use crate::ids::TenantId;
use crate::store::Store;

/// How long to wait before listening again after the notice connection failed.
const RELISTEN_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct Tokens {
    state: RwLock<Remembered>,
    /// The generation, announced each time everything is forgotten.
    generations: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Remembered {
    tenants: HashMap<[u8; 32], TenantId>,
    listening: bool,
    /// Counts the times everything was forgotten, so that a look-up that began before a
    /// change is not remembered after it.
    generation: u64,
}

impl Remembered {
    fn forget_all(&mut self) {
        self.tenants.clear();
        self.generation += 1;
    }
}

/// What [`Tokens::lookup`] found in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Tenant(TenantId),
    /// Ask the database; remember its answer with [`Tokens::remember`] and this generation.
    Unknown {
        generation: u64,
    },
}

impl Tokens {
    pub fn lookup(&self, token_sha256: &[u8; 32]) -> Lookup {
        let state = self.read();
        match state.tenants.get(token_sha256) {
            Some(&tenant) => Lookup::Tenant(tenant),
            None => Lookup::Unknown {
                generation: state.generation,
            },
        }
    }

    /// Remembers the tenant the database gave for a token, unless token changes were noticed
    /// since the look-up began (`generation`) or nobody is listening for them.
    pub fn remember(&self, token_sha256: [u8; 32], tenant: TenantId, generation: u64) {
        let mut state = self.write();
        if state.listening && state.generation == generation {
            state.tenants.insert(token_sha256, tenant);
        }
    }

    /// Changes (`changed()`) each time every remembered token is forgotten: whoever deleted a
    /// token knows that from then on it is refused.
    pub fn forgetting(&self) -> watch::Receiver<u64> {
        self.generations.subscribe()
    }

    /// Tokens changed (or may have, unnoticed): forget them all.
    fn forget_all(&self) {
        let mut state = self.write();
        state.forget_all();
        self.generations.send_replace(state.generation);
    }

    /// Forgets and starts or stops listening under one lock, so that no look-up is remembered
    /// in between.
    fn set_listening(&self, listening: bool) {
        let mut state = self.write();
        state.forget_all();
        state.listening = listening;
        self.generations.send_replace(state.generation);
    }

    /// Listens to token changes for as long as the service runs, listening again after a
    /// lost connection; remembers tokens only while listening.
    pub async fn follow_changes(self: Arc<Self>, store: Store) {
        loop {
            match store.token_changes().await {
                Ok(changes) => {
                    let mut changes = Listening(Some(changes));
                    self.set_listening(true);
                    // `None`: the connection was lost, and notices with it.
                    while let Some(Ok(Some(_))) = changes.try_recv().await {
                        self.forget_all();
                    }
                    self.set_listening(false);
                    tracing::warn!("lost the database's notices of token changes; listening again (tokens are looked up meanwhile)");
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot listen to token changes; tokens are looked up on every request meanwhile")
                }
            }
            actix_web::rt::time::sleep(RELISTEN_AFTER).await;
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Remembered> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Remembered> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A listener that may be dropped after the runtime is gone (a service never stopped, at the
/// end of a test): sqlx's own drop spawns an `UNLISTEN` there and panics. Then the connection
/// is left to close with the process instead.
struct Listening(Option<PgListener>);

impl Listening {
    async fn try_recv(&mut self) -> Option<Result<Option<PgNotification>, sqlx::Error>> {
        Some(self.0.as_mut()?.try_recv().await)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_err() {
            std::mem::forget(self.0.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: [u8; 32] = [7; 32];

    fn generation(lookup: Lookup) -> u64 {
        match lookup {
            Lookup::Unknown { generation } => generation,
            Lookup::Tenant(tenant) => panic!("token already remembered for tenant {tenant}"),
        }
    }

    #[test]
    fn remembers_a_token_only_while_listening() {
        let tokens = Tokens::default();
        let seen = generation(tokens.lookup(&TOKEN));
        tokens.remember(TOKEN, TenantId(3), seen);
        assert!(matches!(tokens.lookup(&TOKEN), Lookup::Unknown { .. }));
        tokens.set_listening(true);
        let seen = generation(tokens.lookup(&TOKEN));
        tokens.remember(TOKEN, TenantId(3), seen);
        assert_eq!(tokens.lookup(&TOKEN), Lookup::Tenant(TenantId(3)));
    }

    #[test]
    fn a_change_forgets_every_token() {
        let tokens = Tokens::default();
        tokens.set_listening(true);
        tokens.remember(TOKEN, TenantId(3), generation(tokens.lookup(&TOKEN)));
        tokens.forget_all();
        assert!(matches!(tokens.lookup(&TOKEN), Lookup::Unknown { .. }));
    }

    #[test]
    fn forgetting_is_announced() {
        let tokens = Tokens::default();
        let mut forgetting = tokens.forgetting();
        tokens.set_listening(true);
        assert!(forgetting.has_changed().expect("alive"));
        forgetting.mark_unchanged();
        tokens.forget_all();
        assert!(forgetting.has_changed().expect("alive"));
    }

    #[test]
    fn a_look_up_that_began_before_a_change_is_not_remembered() {
        let tokens = Tokens::default();
        tokens.set_listening(true);
        let seen = generation(tokens.lookup(&TOKEN));
        tokens.forget_all();
        tokens.remember(TOKEN, TenantId(3), seen);
        assert!(matches!(tokens.lookup(&TOKEN), Lookup::Unknown { .. }));
    }

    #[test]
    fn losing_the_notices_forgets_and_stops_remembering() {
        let tokens = Tokens::default();
        tokens.set_listening(true);
        tokens.remember(TOKEN, TenantId(3), generation(tokens.lookup(&TOKEN)));
        tokens.set_listening(false);
        let seen = generation(tokens.lookup(&TOKEN));
        tokens.remember(TOKEN, TenantId(3), seen);
        assert!(matches!(tokens.lookup(&TOKEN), Lookup::Unknown { .. }));
    }
}
