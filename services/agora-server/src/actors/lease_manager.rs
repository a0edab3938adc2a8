//! `LeaseManager`: the service's timekeeper. It holds every timer (lease ends, revocation
//! deadlines, round deadlines, GPU hosts' heartbeat deadlines), reads the injected clock on a
//! fixed tick, and tells the arbiter what fell due. It runs on its own thread, so a busy
//! arbiter mailbox cannot delay its timers; with a manual clock, tests move time and the next
//! tick fires what is due.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
pub use agora_market::live::Timer;
use agora_market::time::Timestamp;

use crate::clock::Clock;

/// Sent to the arbiter when a timer falls due.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct TimerFired {
    pub timer: Timer,
    pub now: Timestamp,
}

#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Schedule {
    pub at: Timestamp,
    pub timer: Timer,
}

#[derive(Debug)]
pub struct LeaseManager {
    clock: Arc<dyn Clock>,
    tick: Duration,
    due: BTreeSet<(Timestamp, Timer)>,
    notify: Recipient<TimerFired>,
}

impl LeaseManager {
    /// Starts the lease manager on a thread of its own.
    pub fn start_on_own_thread(
        clock: Arc<dyn Clock>,
        tick: Duration,
        notify: Recipient<TimerFired>,
    ) -> Addr<Self> {
        let thread = actix::Arbiter::new();
        Self::start_in_arbiter(&thread.handle(), move |_| Self {
            clock,
            tick,
            due: BTreeSet::new(),
            notify,
        })
    }

    fn fire_due(&mut self) {
        let now = self.clock.now();
        while let Some(&(at, timer)) = self.due.first() {
            if at > now {
                break;
            }
            self.due.pop_first();
            self.notify.do_send(TimerFired { timer, now });
        }
    }
}

impl Actor for LeaseManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.tick, |manager, _| manager.fire_due());
    }
}

impl Handler<Schedule> for LeaseManager {
    type Result = ();

    fn handle(&mut self, schedule: Schedule, _: &mut Self::Context) {
        self.due.insert((schedule.at, schedule.timer));
    }
}

impl Handler<super::Shutdown> for LeaseManager {
    type Result = ();

    /// Stops the timers and the thread they run on.
    fn handle(&mut self, _: super::Shutdown, ctx: &mut Self::Context) {
        ctx.stop();
        actix::Arbiter::current().stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use tokio::sync::mpsc;

    /// Passes on every timer that fired, as it arrives.
    #[derive(Debug)]
    struct Recorder(mpsc::UnboundedSender<(Timer, Timestamp)>);

    impl Actor for Recorder {
        type Context = Context<Self>;
    }

    impl Handler<TimerFired> for Recorder {
        type Result = ();
        fn handle(&mut self, fired: TimerFired, _: &mut Self::Context) {
            let _ = self.0.send((fired.timer, fired.now));
        }
    }

    async fn next_fired(
        fired: &mut mpsc::UnboundedReceiver<(Timer, Timestamp)>,
    ) -> (Timer, Timestamp) {
        tokio::time::timeout(Duration::from_secs(30), fired.recv())
            .await
            .expect("a timer fires")
            .expect("the recorder runs")
    }

    #[actix::test]
    async fn timers_fire_once_when_the_clock_passes_them_in_order() {
        let clock = ManualClock::starting_at(Timestamp(0));
        let (sender, mut fired) = mpsc::unbounded_channel();
        let recorder = Recorder(sender).start();
        let manager = LeaseManager::start_on_own_thread(
            Arc::new(clock.clone()),
            Duration::from_millis(5),
            recorder.recipient(),
        );
        for (at, timer) in [(2_000, Timer::RoundDeadline(7)), (1_000, Timer::LeaseEnd)] {
            manager
                .send(Schedule {
                    at: Timestamp(at),
                    timer,
                })
                .await
                .expect("running");
        }
        // Whatever fires first shows the time it fired at: a timer fired before its time
        // (at t=0) would show here.
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(
            next_fired(&mut fired).await,
            (Timer::LeaseEnd, Timestamp(1_500))
        );
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(
            next_fired(&mut fired).await,
            (Timer::RoundDeadline(7), Timestamp(2_500))
        );
        assert!(fired.try_recv().is_err(), "each timer fires once");
    }
}
