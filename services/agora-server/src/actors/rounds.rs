//! The arbiter's rounds as operators see them: each record of the state machine written
//! within its round's trace and counted in the metrics, and each decision computed on a
//! blocking thread.

use std::time::Instant;

use actix::prelude::*;
use agora_market::live::{DecideJob, Event, Record, RoundId};

use super::arbiter::Arbiter;
use super::records;
use crate::metrics::metrics;
use crate::telemetry::RoundTrace;

impl Arbiter {
    /// Writes a record of the state machine's, within the span it belongs to.
    pub(super) fn write(&mut self, record: Record, began: Instant, ctx: &mut Context<Self>) {
        let commit = records::of_record(self.market(), self.now(), &record);
        match record {
            Record::RoundOpened {
                id, offer, span, ..
            } => {
                metrics().observe_standings(&offer.standings);
                let (gpus, bidders) = (offer.offer.offer.gpus.len(), offer.bidders.len());
                let offering = tracing::info_span!(parent: &span, "offer", gpus, bidders);
                self.round_trace = Some(RoundTrace::collecting_bids(id, span, began));
                offering.in_scope(|| self.queue(commit, ctx));
            }
            Record::RoundClosed { id, outcome, .. } => {
                let trace = self.round_trace.take_if(|trace| trace.round == id);
                let _round = trace.as_ref().map(|trace| trace.span.clone().entered());
                let (bidders, leases) = (outcome.bidders.len(), outcome.leases.len());
                tracing::info!(round = id, bidders, leases, "round closed");
                if let Some(trace) = &trace {
                    metrics().round_closed(trace.began().elapsed());
                }
                self.queue(commit, ctx);
            }
            Record::RoundAbandoned { id, .. } => {
                let trace = self.round_trace.take_if(|trace| trace.round == id);
                let _round = trace.map(|trace| trace.span.entered());
                self.queue(commit, ctx);
            }
            Record::LeasesExpired { .. } => self.queue(commit, ctx),
            Record::NoticeServed { revoked, .. } => {
                metrics().leases_revoked(revoked.iter().count());
                self.queue(commit, ctx);
            }
            Record::HostsDown { hosts } => {
                metrics().leases_revoked(hosts.iter().map(|host| host.revoked.len()).sum());
                self.queue(commit, ctx);
                for host in &hosts {
                    self.mirror_service(&host.host);
                    tracing::warn!(host = %host.host, "GPU host stopped heartbeating; its leases were revoked");
                }
            }
        }
    }

    /// The trace of round `round`: a round reopened after a restart continues in a new one.
    pub(super) fn trace_of(&mut self, round: RoundId) -> &mut RoundTrace {
        let trace = self.round_trace.take_if(|trace| trace.round == round);
        self.round_trace.insert(trace.unwrap_or_else(|| {
            let span = tracing::info_span!(parent: None, "auction_round", round);
            RoundTrace::collecting_bids(round, span, Instant::now())
        }))
    }

    /// Decides a round on a blocking thread (the solver may take long; meanwhile the mailbox
    /// goes on serving releases, progress and registrations) and feeds the decision back.
    pub(super) fn decide(&mut self, job: Box<DecideJob>, ctx: &mut Context<Self>) {
        let round = job.round;
        let trace = self.trace_of(round);
        trace.bids_collected();
        let round_span = trace.span.clone();
        let solver_span = round_span.clone();
        let decided =
            actix_web::rt::task::spawn_blocking(move || solver_span.in_scope(|| job.run()));
        let settle = decided.into_actor(self).map(move |decided, arbiter, ctx| {
            let decided = match decided {
                Ok(decided) => decided.map(Box::new).map_err(|error| error.to_string()),
                Err(panic) => Err(format!("the auction failed: {panic}")),
            };
            let _round = round_span.enter();
            arbiter.feed(Event::Decided { round, decided }, ctx);
        });
        ctx.spawn(settle);
    }
}
