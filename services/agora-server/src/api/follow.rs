//! The one follower of the service's news, for server-sent event streams and long-polls: it
//! reads what follows a cursor in the database, and between reads waits for the arbiter's
//! notice that there is more (`notices.rs`). An app's event stream and long-poll
//! (`events.rs`) and the dashboard's rounds stream (`dashboard.rs`) each follow a [`Feed`].

use std::future::Future;
use std::time::Duration;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::HttpResponse;
use futures_util::stream as streams;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::store::StoreError;

/// Items read at most per wake-up (and per SSE chunk).
const PAGE: i64 = 100;
/// A comment line this often keeps proxies from closing an idle stream.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// What a follower reads: items in the order of their ids.
pub trait Feed {
    type Item;

    /// Items with an id after `cursor`, oldest first, at most `limit`. Never one after an
    /// item that may still appear, so a reader resuming after the last id it saw skips none.
    fn after(
        &self,
        cursor: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Self::Item>, StoreError>>;

    /// The item's id: where to resume after it.
    fn id(item: &Self::Item) -> i64;

    /// The item as one server-sent event, without its `id:` line.
    fn frame(item: &Self::Item) -> String;
}

/// Follows a feed from a cursor. It subscribes to the feed's notices before its first read, so
/// an item committed between a read and the wait still wakes the wait.
pub struct Follower<F> {
    feed: F,
    notices: watch::Receiver<()>,
    cursor: i64,
}

impl<F: Feed + 'static> Follower<F> {
    pub fn new(feed: F, notices: watch::Receiver<()>, after: i64) -> Self {
        Self {
            feed,
            notices,
            cursor: after,
        }
    }

    /// The items after the cursor, waiting up to `timeout` for the first; moves the cursor
    /// past them. Empty when the timeout passed.
    pub async fn wait(&mut self, timeout: Duration) -> Result<Vec<F::Item>, StoreError> {
        let deadline = Instant::now() + timeout;
        loop {
            let items = self.feed.after(self.cursor, PAGE).await?;
            if let Some(last) = items.last() {
                self.cursor = F::id(last);
                return Ok(items);
            }
            if !self.wait_for_notice(deadline).await {
                return Ok(Vec::new());
            }
        }
    }

    /// False when the deadline passed without a notice.
    async fn wait_for_notice(&mut self, deadline: Instant) -> bool {
        match tokio::time::timeout_at(deadline, self.notices.changed()).await {
            Ok(Ok(())) => true,
            Err(_) => false,
            // The announcer is gone (the service is stopping): nothing more will come.
            Ok(Err(_)) => {
                tokio::time::sleep_until(deadline).await;
                false
            }
        }
    }

    /// The next SSE chunk: items, a keep-alive comment after `keepalive` without any, or an
    /// error comment.
    async fn next_chunk(&mut self, keepalive: Duration) -> Bytes {
        match self.wait(keepalive).await {
            Ok(items) if items.is_empty() => Bytes::from_static(b": keep-alive\n\n"),
            Ok(items) => Bytes::from(
                items
                    .iter()
                    .map(|item| format!("id: {}\n{}\n\n", F::id(item), F::frame(item)))
                    .collect::<String>(),
            ),
            // The reason is logged; the client only learns to expect a retry.
            Err(error) => Bytes::from(format!(": {}\n\n", super::problem::ApiError::from(error))),
        }
    }

    /// The server-sent event stream of the feed from the cursor on, until the client leaves.
    pub fn into_event_stream(self) -> HttpResponse {
        let chunks = streams::unfold(self, |mut follower| async move {
            let chunk = follower.next_chunk(KEEPALIVE).await;
            Some((Ok::<_, actix_web::Error>(chunk), follower))
        });
        HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .streaming(chunks)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::Notify;

    use super::*;
    use crate::notices::{Notices, Topic};

    /// A feed of numbered lines kept in memory, as the tables are in Postgres; it tells each
    /// time it is read.
    #[derive(Clone, Default)]
    struct Lines {
        lines: Arc<Mutex<Vec<(i64, &'static str)>>>,
        read: Arc<Notify>,
    }

    impl Lines {
        fn commit(&self, id: i64, line: &'static str) {
            self.lines.lock().expect("not poisoned").push((id, line));
        }
    }

    impl Feed for Lines {
        type Item = (i64, &'static str);

        async fn after(&self, cursor: i64, limit: i64) -> Result<Vec<Self::Item>, StoreError> {
            self.read.notify_one();
            let lines = self.lines.lock().expect("not poisoned");
            Ok(lines
                .iter()
                .filter(|(id, _)| *id > cursor)
                .take(limit as usize)
                .copied()
                .collect())
        }

        fn id(item: &Self::Item) -> i64 {
            item.0
        }

        fn frame(item: &Self::Item) -> String {
            format!("event: line\ndata: {}", item.1)
        }
    }

    fn follower(lines: &Lines, notices: &Notices, after: i64) -> Follower<Lines> {
        Follower::new(lines.clone(), notices.follow(Topic::Rounds), after)
    }

    #[tokio::test]
    async fn what_is_there_is_read_from_the_cursor_on_and_only_once() {
        let (lines, notices) = (Lines::default(), Notices::default());
        for (id, line) in [(1, "a"), (2, "b"), (3, "c")] {
            lines.commit(id, line);
        }
        let mut follower = follower(&lines, &notices, 1);
        let items = follower.wait(Duration::ZERO).await.expect("read");
        assert_eq!(items, vec![(2, "b"), (3, "c")]);
        assert!(follower
            .wait(Duration::ZERO)
            .await
            .expect("read")
            .is_empty());
    }

    #[tokio::test]
    async fn a_waiting_follower_wakes_at_the_notice_with_what_was_committed() {
        let (lines, notices) = (Lines::default(), Notices::default());
        let mut follower = follower(&lines, &notices, 0);
        let committer = async {
            // Once the follower has read and found nothing.
            lines.read.notified().await;
            lines.commit(1, "a");
            notices.announce(Topic::Rounds);
        };
        // A follower that missed the notice would wait the whole minute and return nothing.
        let (items, ()) = tokio::join!(follower.wait(Duration::from_secs(60)), committer);
        assert_eq!(items.expect("read"), vec![(1, "a")]);
    }

    #[tokio::test]
    async fn the_stream_sends_each_item_once_with_its_id_and_keeps_alive_when_idle() {
        let (lines, notices) = (Lines::default(), Notices::default());
        lines.commit(1, "a");
        let mut follower = follower(&lines, &notices, 0);
        assert_eq!(
            follower.next_chunk(Duration::ZERO).await,
            Bytes::from_static(b"id: 1\nevent: line\ndata: a\n\n")
        );
        assert_eq!(
            follower.next_chunk(Duration::ZERO).await,
            Bytes::from_static(b": keep-alive\n\n")
        );
        lines.commit(2, "b");
        lines.commit(3, "c");
        assert_eq!(
            follower.next_chunk(Duration::ZERO).await,
            Bytes::from_static(b"id: 2\nevent: line\ndata: b\n\nid: 3\nevent: line\ndata: c\n\n")
        );
    }
}
