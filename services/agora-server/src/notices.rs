//! Who is waiting for news of which app. After each commit the arbiter announces the apps that
//! have new events (in `app_events`); a follower of one app (a long-poll, an event stream)
//! wakes only for its app, and the dashboard's round stream hears every announcement. The
//! news itself is always read from the database, so a missed wake-up costs latency, not events.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{broadcast, watch};

#[derive(Debug)]
pub struct Notices {
    any: broadcast::Sender<i64>,
    apps: Mutex<HashMap<i64, watch::Sender<()>>>,
}

impl Default for Notices {
    fn default() -> Self {
        Self {
            any: broadcast::channel(1024).0,
            apps: Mutex::default(),
        }
    }
}

impl Notices {
    /// `app` has new events.
    pub fn announce(&self, app: i64) {
        // No listener is not an error: the events wait in the database.
        let _ = self.any.send(app);
        let mut apps = self
            .apps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(followers) = apps.get(&app) {
            if followers.receiver_count() == 0 {
                apps.remove(&app);
            } else {
                followers.send_replace(());
            }
        }
    }

    /// Wakes (`changed()`) at the next announcement for `app` after this call.
    pub fn follow(&self, app: i64) -> watch::Receiver<()> {
        let mut apps = self
            .apps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        apps.entry(app)
            .or_insert_with(|| watch::channel(()).0)
            .subscribe()
    }

    /// Every announcement, for any app.
    pub fn subscribe_all(&self) -> broadcast::Receiver<i64> {
        self.any.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn woken(follower: &mut watch::Receiver<()>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), follower.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_follower_wakes_for_its_app_only() {
        let notices = Notices::default();
        let mut first = notices.follow(1);
        let mut second = notices.follow(2);
        let mut everything = notices.subscribe_all();
        notices.announce(1);
        assert!(woken(&mut first).await);
        assert!(!woken(&mut second).await);
        assert_eq!(everything.recv().await.expect("announced"), 1);
    }

    #[tokio::test]
    async fn an_announcement_before_following_does_not_wake() {
        let notices = Notices::default();
        notices.announce(3);
        let mut follower = notices.follow(3);
        assert!(!woken(&mut follower).await);
        notices.announce(3);
        assert!(woken(&mut follower).await);
    }

    #[tokio::test]
    async fn apps_nobody_follows_are_forgotten() {
        let notices = Notices::default();
        drop(notices.follow(4));
        notices.announce(4);
        assert!(notices.apps.lock().expect("not poisoned").is_empty());
    }
}
