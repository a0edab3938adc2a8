//! Who is waiting for news of what. After each commit the arbiter announces what it changed:
//! each app with new events (in `app_events`), and the rounds, when one was decided. A
//! follower (an app's long-poll or event stream, the dashboard's rounds stream; see
//! `api/follow.rs`) wakes only for its topic. The news itself is always read from the
//! database, so a missed wake-up costs latency, not events.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::ids::AppKey;
use crate::store::Commit;

/// What a follower waits for news of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    /// New events of this app.
    App(AppKey),
    /// A round was decided (closed or abandoned).
    Rounds,
}

#[derive(Debug, Default)]
pub struct Notices {
    topics: Mutex<HashMap<Topic, watch::Sender<()>>>,
}

impl Notices {
    /// Announces what `commit`, now durable, changed.
    pub fn announce_commit(&self, commit: &Commit) {
        let apps: BTreeSet<AppKey> = commit.events.iter().map(|event| event.app).collect();
        for app in apps {
            self.announce(Topic::App(app));
        }
        if commit.closed_round.is_some() || !commit.abandoned_rounds.is_empty() {
            self.announce(Topic::Rounds);
        }
    }

    /// `topic` has news.
    pub fn announce(&self, topic: Topic) {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // No follower is not an error: the news waits in the database.
        if let Some(followers) = topics.get(&topic) {
            if followers.receiver_count() == 0 {
                topics.remove(&topic);
            } else {
                followers.send_replace(());
            }
        }
    }

    /// Wakes (`changed()`) at the next announcement of `topic` after this call.
    pub fn follow(&self, topic: Topic) -> watch::Receiver<()> {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        topics
            .entry(topic)
            .or_insert_with(|| watch::channel(()).0)
            .subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RoundId;

    fn woken(follower: &mut watch::Receiver<()>) -> bool {
        follower.has_changed().expect("the notices are alive")
    }

    #[test]
    fn a_follower_wakes_for_its_topic_only() {
        let notices = Notices::default();
        let mut first = notices.follow(Topic::App(AppKey(1)));
        let mut second = notices.follow(Topic::App(AppKey(2)));
        let mut rounds = notices.follow(Topic::Rounds);
        notices.announce(Topic::App(AppKey(1)));
        assert!(woken(&mut first));
        assert!(!woken(&mut second));
        assert!(!woken(&mut rounds));
    }

    #[test]
    fn an_announcement_before_following_does_not_wake() {
        let notices = Notices::default();
        notices.announce(Topic::App(AppKey(3)));
        let mut follower = notices.follow(Topic::App(AppKey(3)));
        assert!(!woken(&mut follower));
        notices.announce(Topic::App(AppKey(3)));
        assert!(woken(&mut follower));
    }

    #[test]
    fn topics_nobody_follows_are_forgotten() {
        let notices = Notices::default();
        drop(notices.follow(Topic::App(AppKey(4))));
        notices.announce(Topic::App(AppKey(4)));
        assert!(notices.topics.lock().expect("not poisoned").is_empty());
    }

    #[test]
    fn a_commit_wakes_its_apps_and_the_rounds_only_when_a_round_was_decided() {
        let notices = Notices::default();
        let mut app = notices.follow(Topic::App(AppKey(5)));
        let mut rounds = notices.follow(Topic::Rounds);
        notices.announce_commit(&Commit::default());
        assert!(!woken(&mut app) && !woken(&mut rounds));
        let abandoned = Commit {
            abandoned_rounds: vec![RoundId(9)],
            ..Commit::default()
        };
        notices.announce_commit(&abandoned);
        assert!(!woken(&mut app));
        assert!(woken(&mut rounds));
    }
}
