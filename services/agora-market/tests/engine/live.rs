//! The live round's state machine on fake time: every transition, failures included, with the
//! effects it asks for; and, on random event sequences, that no GPU is leased twice, every
//! round opened ends once, and nothing happens after a refused write.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use agora_market::app::AppId;
use agora_market::auction::{AppBid, BidEntry};
use agora_market::bids::PreparedOffer;
use agora_market::lease::LeaseId;
use agora_market::live::{
    Bidding, DecideJob, Effect, Event, LiveError, LiveMarket, LiveSettings, Record, Recovered,
    ReopenedRound, RoundId, Timer,
};
use agora_market::market::{BidInputs, Market, MarketConfig, Withdrawal};
use agora_market::rho::Rho;
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, GpuId, GpuIndex};
use proptest::prelude::*;

use crate::support::{host, single_job_app, LEASE};

/// Hosts heartbeat rarely here, so that only the tests of silent hosts lose any.
const SETTINGS: LiveSettings = LiveSettings {
    round_deadline: Duration::from_secs(10),
    revocation_grace: Duration::from_secs(30),
    heartbeat_interval: Duration::from_secs(3_600),
};

/// Two hosts of two GPUs each; everyone bids (f = 0).
fn market_of_two_hosts() -> Market {
    let config = MarketConfig {
        fairness_knob: 0.0,
        lease_length: LEASE,
        ..MarketConfig::default()
    };
    let mut market = Market::new(
        Cluster::new(Vec::new()).expect("empty"),
        config,
        Timestamp(0),
    )
    .expect("valid");
    for (name, gpus) in [("h1", ["GPU-1", "GPU-2"]), ("h2", ["GPU-3", "GPU-4"])] {
        let spec = host(name, &gpus);
        market
            .register_host(&spec, Timestamp(0))
            .expect("valid host");
    }
    market
}

fn fresh(market: Market) -> Recovered {
    Recovered {
        market,
        bidding: BTreeMap::new(),
        round: None,
        next_round: 1,
    }
}

/// A market where `a` and `b`, wanting 4 GPUs each, are both offered GPUs in round 1.
fn two_bidders(a: Bidding, b: Bidding) -> Shell {
    let mut market = market_of_two_hosts();
    for app in ["a", "b"] {
        market
            .add_app(single_job_app(app, 4, 1_000, 10.0), Timestamp(0))
            .expect("new app");
    }
    let mut shell = Shell::new(Recovered {
        bidding: [("a", a), ("b", b)]
            .map(|(app, bidding)| (AppId::from(app), bidding))
            .into(),
        ..fresh(market)
    });
    assert_eq!(shell.open_round(), 1);
    shell.take_records();
    shell
}

/// A round's bid requests: the round, its offer, each bidder's inputs.
type BidRequests = (RoundId, Arc<PreparedOffer>, Vec<(AppId, BidInputs)>);

/// The shell, faked: it keeps the timers, the records and the jobs the state machine asks
/// for, and moves time only when told.
struct Shell {
    live: LiveMarket,
    now: Timestamp,
    timers: BTreeSet<(Timestamp, Timer)>,
    records: Vec<Record>,
    jobs: Vec<DecideJob>,
    /// The bid requests not answered yet.
    requests: Vec<BidRequests>,
    halted: Option<String>,
}

impl Shell {
    fn new(recovered: Recovered) -> Self {
        Self::with_settings(recovered, SETTINGS)
    }

    fn with_settings(recovered: Recovered, settings: LiveSettings) -> Self {
        let mut shell = Self {
            live: LiveMarket::new(recovered, settings, 7),
            now: Timestamp(0),
            timers: BTreeSet::new(),
            records: Vec::new(),
            jobs: Vec::new(),
            requests: Vec::new(),
            halted: None,
        };
        shell.feed(Event::Started).expect("starts");
        shell
    }

    fn feed(&mut self, event: Event) -> Result<(), LiveError> {
        for effect in self.live.handle(self.now, event)? {
            match effect {
                Effect::Record(record) => self.records.push(*record),
                Effect::RequestBids {
                    round,
                    offer,
                    bidders,
                } => self.requests.push((round, offer, bidders)),
                Effect::SetTimer { at, timer } => {
                    self.timers.insert((at, timer));
                }
                Effect::Decide(job) => self.jobs.push(*job),
                Effect::Halt { reason } => self.halted = Some(reason),
            }
        }
        Ok(())
    }

    fn register(&mut self, name: &str, gpus: u32, bidding: Bidding) {
        let app = single_job_app(name, gpus, 1_000, 10.0);
        let cluster_seconds = self.live.market().cluster_time(&app);
        self.feed(Event::AppRegistered {
            app,
            bidding,
            arrived_at: self.now,
            cluster_seconds,
        })
        .expect("a new app");
    }

    /// Time moves on; every timer due by then fires, in order.
    fn advance(&mut self, by: Duration) {
        let until = self.now.saturating_add(by);
        while let Some(&(at, timer)) = self.timers.first() {
            if at > until {
                break;
            }
            self.timers.pop_first();
            self.now = self.now.max(at);
            match self.feed(Event::TimerFired(timer)) {
                Ok(()) | Err(LiveError::Halted(_)) => {}
                Err(error) => panic!("a timer refused: {error}"),
            }
        }
        self.now = until;
    }

    /// Every agent asked answers with its bid (a fallback for explicit bidders).
    fn agents_bid(&mut self) {
        for (round, offer, bidders) in std::mem::take(&mut self.requests) {
            for (app, inputs) in bidders {
                let fallback = self.live.bidding(&app) == Some(Bidding::Explicit);
                let bid = inputs.bid(&offer);
                self.feed(Event::AgentBid {
                    round,
                    bid,
                    fallback,
                })
                .expect("an agent's bid");
            }
        }
    }

    /// Runs the decisions asked for, as a blocking thread would, and feeds them back.
    fn decide(&mut self) {
        while let Some(job) = self.jobs.pop() {
            let round = job.round;
            let decided = job.run().map(Box::new).map_err(|error| error.to_string());
            self.feed(Event::Decided { round, decided })
                .expect("a decision");
        }
    }

    /// The app leaves (finishes): staged on a copy, as the shell does.
    fn leave(&mut self, name: &str) {
        let mut market = self.live.market().clone();
        market
            .remove_app(&AppId::from(name), self.now)
            .expect("an active app");
        self.feed(Event::MarketChanged {
            market: Box::new(market),
            departed: vec![AppId::from(name)],
            capacity_freed: true,
        })
        .expect("a change");
    }

    fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    fn open_round(&self) -> RoundId {
        self.live.open_round().expect("a round is open").id
    }

    fn gpu(&self, id: &str) -> GpuIndex {
        self.live
            .market()
            .cluster()
            .index_of(&GpuId::from(id))
            .expect("a GPU of the cluster")
    }
}

fn opened(records: &[Record]) -> Vec<RoundId> {
    records
        .iter()
        .filter_map(|record| match record {
            Record::RoundOpened { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

fn closed(records: &[Record]) -> Vec<(RoundId, BTreeMap<String, usize>)> {
    records
        .iter()
        .filter_map(|record| match record {
            Record::RoundClosed { id, outcome, .. } => Some((
                *id,
                outcome
                    .leases
                    .iter()
                    .map(|lease| (lease.app.0.clone(), lease.gpus.len()))
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

fn won(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .map(|&(app, gpus)| (app.to_owned(), gpus))
        .collect()
}

/// A bid for `gpus` of the offer, with a rho of 2 on them.
fn framework_bid(app: &str, gpus: &[&str]) -> AppBid {
    AppBid {
        app: AppId::from(app),
        rho_old: None,
        bids: vec![BidEntry {
            gpus: gpus.iter().map(|&id| GpuId::from(id)).collect(),
            rho: Rho::new(2.0).expect("a valid rho"),
        }],
    }
}

#[test]
fn an_empty_offer_opens_no_round() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    assert!(
        opened(&shell.take_records()).is_empty(),
        "nobody wants GPUs"
    );
    let empty = Market::new(
        Cluster::new(Vec::new()).expect("empty"),
        MarketConfig::default(),
        Timestamp(0),
    )
    .expect("valid");
    let mut shell_without_gpus = Shell::new(fresh(empty));
    shell_without_gpus.register("a", 2, Bidding::Agent);
    assert!(shell_without_gpus.records.is_empty(), "no GPU to offer");
    assert!(shell_without_gpus.live.open_round().is_none());
    assert_eq!(
        shell_without_gpus.live.next_round(),
        1,
        "no round number used"
    );
    // Once every GPU is leased, an arrival finds nothing to offer either.
    shell.register("a", 4, Bidding::Agent);
    shell.agents_bid();
    shell.decide();
    shell.take_records();
    shell.register("b", 4, Bidding::Agent);
    assert!(
        opened(&shell.take_records()).is_empty(),
        "every GPU is leased"
    );
}

#[test]
fn a_round_closes_as_soon_as_every_agent_has_bid_before_its_deadline() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Agent);
    assert_eq!(
        opened(&shell.take_records()),
        vec![1],
        "an arrival opens a round"
    );
    assert!(shell
        .timers
        .contains(&(Timestamp(10_000), Timer::RoundDeadline(1))));
    let asked: Vec<&str> = shell.requests[0]
        .2
        .iter()
        .map(|(app, _)| app.0.as_str())
        .collect();
    assert_eq!(asked, ["a"]);
    shell.agents_bid();
    assert_eq!(
        shell.jobs.len(),
        1,
        "decided without waiting for the deadline"
    );
    shell.decide();
    let records = shell.take_records();
    assert_eq!(closed(&records), vec![(1, won(&[("a", 2)]))]);
    assert!(
        shell
            .timers
            .contains(&(Timestamp(600_000), Timer::LeaseEnd)),
        "the lease's end is timed"
    );
    assert!(opened(&records).is_empty(), "nobody else wants GPUs");
}

#[test]
fn an_arrival_while_a_round_is_decided_opens_the_next_round_after_it() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Agent);
    shell.agents_bid();
    shell.register("b", 2, Bidding::Agent);
    let records = shell.take_records();
    assert_eq!(opened(&records), vec![1], "round 1 is still being decided");
    shell.decide();
    let records = shell.take_records();
    assert_eq!(
        closed(&records),
        vec![(1, won(&[("a", 2)]))],
        "b came too late for it"
    );
    assert_eq!(opened(&records), vec![2], "b's round follows");
}

#[test]
fn an_explicit_bidder_is_waited_for_until_the_deadline_then_its_agents_fallback_counts() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Explicit);
    shell.agents_bid();
    shell.take_records();
    assert!(shell.jobs.is_empty(), "a fallback does not close the round");
    shell.advance(Duration::from_secs(9));
    assert!(shell.jobs.is_empty(), "before the deadline");
    shell.advance(Duration::from_secs(1));
    assert_eq!(shell.jobs.len(), 1, "closed at the deadline");
    shell.decide();
    let records = shell.take_records();
    let Some(Record::RoundClosed {
        agent_bids_used, ..
    }) = records.first()
    else {
        panic!("round closed: {records:?}");
    };
    assert_eq!(agent_bids_used.len(), 1, "the fallback was used");
}

#[test]
fn a_framework_bid_closes_the_round_and_counts_instead_of_the_fallback() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Explicit);
    shell.agents_bid();
    shell.take_records();
    let round = shell.open_round();
    let bid = framework_bid("a", &["GPU-3"]);
    shell
        .feed(Event::FrameworkBid { round, bid })
        .expect("a valid bid");
    shell.decide();
    let records = shell.take_records();
    let Some(Record::RoundClosed {
        agent_bids_used,
        outcome,
        ..
    }) = records.first()
    else {
        panic!("round closed: {records:?}");
    };
    assert!(
        agent_bids_used.is_empty(),
        "the framework's own bid counted"
    );
    let three = shell.gpu("GPU-3");
    assert!(outcome
        .leases
        .iter()
        .any(|lease| lease.gpus.contains(&three)));
}

#[test]
fn bids_are_refused_after_close_for_unknown_rounds_twice_and_outside_the_offer() {
    let mut shell = two_bidders(Bidding::Explicit, Bidding::Explicit);
    let round = shell.open_round();
    let bid = |gpus: &[&str]| framework_bid("a", gpus);
    let refused = |shell: &mut Shell, round, bid| {
        shell
            .feed(Event::FrameworkBid { round, bid })
            .expect_err("refused")
    };
    assert_eq!(
        refused(&mut shell, round + 1, bid(&["GPU-1"])),
        LiveError::UnknownRound(round + 1)
    );
    assert!(matches!(
        refused(&mut shell, round, bid(&["GPU-9"])),
        LiveError::InvalidBid(_)
    ));
    let mut too_large = bid(&["GPU-1"]);
    too_large.bids = vec![too_large.bids[0].clone(); 65];
    assert_eq!(
        refused(&mut shell, round, too_large),
        LiveError::TableTooLarge {
            entries: 65,
            limit: 64
        }
    );
    shell
        .feed(Event::FrameworkBid {
            round,
            bid: bid(&["GPU-1"]),
        })
        .expect("the first bid");
    assert_eq!(
        refused(&mut shell, round, bid(&["GPU-2"])),
        LiveError::AlreadyBid {
            app: AppId::from("a"),
            round
        }
    );
    // Past the deadline, before its timer fired: too late all the same.
    shell.now = Timestamp(10_001);
    let late = framework_bid("b", &["GPU-2"]);
    assert_eq!(
        refused(&mut shell, round, late.clone()),
        LiveError::RoundClosed(round)
    );
    shell.advance(Duration::ZERO);
    shell.decide();
    // A bid after the round closed: refused as closed, nothing counted.
    assert_eq!(
        refused(&mut shell, round, late),
        LiveError::RoundClosed(round)
    );
}

#[test]
fn an_app_not_offered_gpus_cannot_bid() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 4, Bidding::Explicit);
    let round = shell.open_round();
    shell.register("b", 4, Bidding::Explicit);
    let bid = framework_bid("b", &["GPU-1"]);
    assert_eq!(
        shell.feed(Event::FrameworkBid { round, bid }),
        Err(LiveError::NotABidder {
            app: AppId::from("b"),
            round
        }),
        "b arrived after the round opened"
    );
}

#[test]
fn a_bid_that_was_not_stored_no_longer_counts_and_may_be_sent_again() {
    let mut shell = two_bidders(Bidding::Explicit, Bidding::Explicit);
    let round = shell.open_round();
    let bid = framework_bid("a", &["GPU-1"]);
    shell
        .feed(Event::FrameworkBid {
            round,
            bid: bid.clone(),
        })
        .expect("counted");
    shell
        .feed(Event::BidNotStored {
            round,
            app: AppId::from("a"),
        })
        .expect("forgotten");
    shell
        .feed(Event::FrameworkBid { round, bid })
        .expect("counted again");
}

#[test]
fn a_bidder_leaving_mid_round_is_not_waited_for_and_its_share_goes_to_the_others() {
    let mut shell = two_bidders(Bidding::Agent, Bidding::Explicit);
    let round = shell.open_round();
    shell.agents_bid();
    assert!(shell.jobs.is_empty(), "b's framework has not bid");
    shell.leave("b");
    assert_eq!(
        shell.jobs.len(),
        1,
        "nobody left to wait for: the round is decided"
    );
    shell.decide();
    let records = shell.take_records();
    assert_eq!(closed(&records), vec![(round, won(&[("a", 4)]))]);
}

#[test]
fn an_app_leaving_while_the_round_is_decided_gets_the_round_decided_again_without_it() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Agent);
    shell.register("b", 2, Bidding::Agent);
    shell.agents_bid();
    shell.decide();
    shell.agents_bid();
    assert_eq!(shell.jobs.len(), 1, "round 2 (for b) is being decided");
    shell.leave("b");
    let job = shell.jobs.pop().expect("a job");
    let decided = job.run().map(Box::new).map_err(|error| error.to_string());
    shell
        .feed(Event::Decided { round: 2, decided })
        .expect("a decision");
    assert_eq!(shell.jobs.len(), 1, "decided again");
    shell.decide();
    let records = shell.take_records();
    let Some(Record::RoundClosed { id: 2, outcome, .. }) = records
        .iter()
        .find(|record| matches!(record, Record::RoundClosed { id: 2, .. }))
    else {
        panic!("round 2 closed: {records:?}");
    };
    assert!(outcome.departed.contains(&AppId::from("b")));
    assert!(outcome
        .leases
        .iter()
        .all(|lease| lease.app != AppId::from("b")));
}

#[test]
fn a_round_whose_offer_changed_under_its_decision_is_abandoned_and_another_opens() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 4, Bidding::Agent);
    shell.agents_bid();
    shell.take_records();
    // An offered GPU leaves service while the round is decided.
    let gpu = shell.gpu("GPU-2");
    let mut market = shell.live.market().clone();
    market.set_withdrawn(gpu, Withdrawal::Drained, true);
    shell
        .feed(Event::MarketChanged {
            market: Box::new(market),
            departed: Vec::new(),
            capacity_freed: false,
        })
        .expect("a change");
    shell.decide();
    let records = shell.take_records();
    assert!(matches!(
        records.first(),
        Some(Record::RoundAbandoned { id: 1, .. })
    ));
    assert_eq!(opened(&records), vec![2]);
    let offered = &shell
        .live
        .open_round()
        .expect("round 2")
        .offer
        .offer
        .offer
        .gpus;
    assert_eq!(offered.len(), 3, "without the drained GPU");
}

#[test]
fn a_decision_that_failed_abandons_the_round_and_another_opens() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Agent);
    shell.agents_bid();
    shell.jobs.clear();
    shell.take_records();
    shell
        .feed(Event::Decided {
            round: 1,
            decided: Err("the solver panicked".into()),
        })
        .expect("a failure");
    let records = shell.take_records();
    assert!(matches!(
        &records[0],
        Record::RoundAbandoned { id: 1, reason } if reason == "the solver panicked"
    ));
    assert_eq!(opened(&records), vec![2]);
    // A late answer for a round no longer decided changes nothing.
    shell
        .feed(Event::Decided {
            round: 1,
            decided: Err("late".into()),
        })
        .expect("ignored");
    assert!(shell.records.is_empty());
}

#[test]
fn leases_expire_at_their_end_and_their_gpus_are_offered_again() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 4, Bidding::Agent);
    shell.agents_bid();
    shell.decide();
    shell.take_records();
    shell.advance(LEASE - Duration::from_millis(1));
    assert!(shell.records.is_empty(), "not yet");
    shell.advance(Duration::from_millis(1));
    let records = shell.take_records();
    assert!(matches!(
        &records[0],
        Record::LeasesExpired { leases } if leases.len() == 1
    ));
    assert_eq!(opened(&records), vec![2], "a renews onto its claim");
}

#[test]
fn a_notice_revokes_the_lease_when_due_and_a_cancelled_one_revokes_nothing() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 4, Bidding::Agent);
    shell.agents_bid();
    shell.decide();
    shell.take_records();
    let (one, two) = (shell.gpu("GPU-1"), shell.gpu("GPU-2"));
    for gpu in [one, two] {
        let notice = shell
            .live
            .notice_now(gpu, Withdrawal::Unhealthy, "hot".into(), shell.now);
        assert_eq!(
            notice.at,
            Timestamp(30_000),
            "the grace period of a leased GPU"
        );
        shell
            .feed(Event::NoticeGiven { gpu, notice })
            .expect("a notice");
    }
    shell
        .feed(Event::NoticeCancelled {
            gpu: two,
            withdrawal: Withdrawal::Drained,
        })
        .expect("not this reason's notice");
    shell
        .feed(Event::NoticeCancelled {
            gpu: two,
            withdrawal: Withdrawal::Unhealthy,
        })
        .expect("cancelled");
    shell.advance(Duration::from_secs(29));
    assert!(shell.records.is_empty(), "still in its grace period");
    shell.advance(Duration::from_secs(1));
    let records = shell.take_records();
    let Some(Record::NoticeServed {
        gpu,
        revoked: Some(lease),
        ..
    }) = records.first()
    else {
        panic!("a revocation: {records:?}");
    };
    assert_eq!(*gpu, one);
    assert!(lease.gpus.contains(&one));
    assert!(records
        .iter()
        .all(|record| !matches!(record, Record::NoticeServed { gpu, .. } if *gpu == two)));
    assert!(!shell.live.market().is_healthy(one), "out of service");
    assert!(shell.live.market().is_healthy(two));
    assert!(shell.live.notice(two).is_none());
}

#[test]
fn a_worker_lost_mid_lease_loses_its_leases_after_two_silent_intervals() {
    let settings = LiveSettings {
        heartbeat_interval: Duration::from_secs(5),
        ..SETTINGS
    };
    let mut shell = Shell::with_settings(fresh(market_of_two_hosts()), settings);
    shell.register("a", 4, Bidding::Agent);
    shell.agents_bid();
    shell.decide();
    shell.take_records();
    shell.advance(Duration::from_secs(8));
    shell
        .feed(Event::HostSeen { host: "h1".into() })
        .expect("a heartbeat");
    shell.advance(Duration::from_secs(2));
    let records = shell.take_records();
    let Some(Record::HostsDown { hosts }) = records.first() else {
        panic!("h2 went down: {records:?}");
    };
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].host, "h2");
    assert_eq!(hosts[0].revoked.len(), 1, "a's lease held GPUs on h2");
    assert!(shell.live.market().leases().active().next().is_none());
    // h1's GPUs are offered again, h2's are not.
    let offered = &shell
        .live
        .open_round()
        .expect("a new round")
        .offer
        .offer
        .offer
        .gpus;
    assert_eq!(offered.len(), 2);
    shell.advance(Duration::from_secs(20));
    let downs: Vec<Vec<String>> = shell
        .take_records()
        .iter()
        .filter_map(|record| match record {
            Record::HostsDown { hosts } => {
                Some(hosts.iter().map(|host| host.host.clone()).collect())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        downs,
        vec![vec!["h1".to_owned()]],
        "h1 falls silent later; h2 goes down once"
    );
}

#[test]
fn a_refused_write_halts_the_state_machine() {
    let mut shell = Shell::new(fresh(market_of_two_hosts()));
    shell.register("a", 2, Bidding::Agent);
    shell
        .feed(Event::CommitRefused {
            reason: "disk full".into(),
        })
        .expect("halts");
    assert_eq!(shell.halted.as_deref(), Some("disk full"));
    assert!(shell.live.is_halted());
    let round = shell.open_round();
    let bid = framework_bid("a", &["GPU-1"]);
    assert_eq!(
        shell.feed(Event::FrameworkBid { round, bid }),
        Err(LiveError::Halted("disk full".into()))
    );
    shell.records.clear();
    shell.advance(Duration::from_secs(3_600));
    assert!(
        shell.records.is_empty(),
        "no timer decides anything after it"
    );
}

#[test]
fn a_restored_round_reopens_with_its_bids_and_its_own_deadline() {
    let mut market = market_of_two_hosts();
    for app in ["a", "b"] {
        market
            .add_app(single_job_app(app, 2, 100, 1.0), Timestamp(0))
            .expect("new app");
    }
    let offer = market.open_round(Timestamp(0)).expect("an offer");
    let recovered = Recovered {
        market,
        bidding: [("a", Bidding::Explicit), ("b", Bidding::Agent)]
            .map(|(app, bidding)| (AppId::from(app), bidding))
            .into(),
        round: Some(ReopenedRound {
            id: 41,
            seed: 3,
            deadline: Timestamp(4_000),
            offer,
            framework_bids: [(AppId::from("a"), framework_bid("a", &["GPU-1"]))].into(),
        }),
        next_round: 42,
    };
    let mut shell = Shell::new(recovered);
    assert!(
        opened(&shell.records).is_empty(),
        "reopened, not opened anew"
    );
    assert_eq!(shell.open_round(), 41);
    assert!(shell
        .timers
        .contains(&(Timestamp(4_000), Timer::RoundDeadline(41))));
    assert!(
        shell
            .timers
            .contains(&(Timestamp(7_200_000), Timer::HostLiveness)),
        "hosts that were up get two intervals to heartbeat"
    );
    shell.agents_bid();
    assert_eq!(
        shell.jobs.len(),
        1,
        "a had bid before the restart, b's agent now"
    );
    shell.decide();
    assert_eq!(closed(&shell.take_records())[0].0, 41);
}

/// One step of a random life of the live market.
#[derive(Debug, Clone)]
enum Step {
    Arrive { gpus: u32, explicit: bool },
    AgentsBid,
    FrameworksBid,
    Decide,
    Leave(usize),
    Advance(u64),
    Drain(u32),
    Heartbeat(bool),
    Refuse,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u32..=4, any::<bool>()).prop_map(|(gpus, explicit)| Step::Arrive { gpus, explicit }),
        4 => Just(Step::AgentsBid),
        2 => Just(Step::FrameworksBid),
        4 => Just(Step::Decide),
        2 => (0usize..8).prop_map(Step::Leave),
        4 => (1u64..700).prop_map(Step::Advance),
        1 => (0u32..4).prop_map(Step::Drain),
        3 => any::<bool>().prop_map(Step::Heartbeat),
        1 => Just(Step::Refuse),
    ]
}

/// The leases the records say are active, by GPU: what Postgres's exclusion constraint sees.
#[derive(Default)]
struct Ledger {
    held: BTreeMap<GpuIndex, LeaseId>,
    rounds: BTreeMap<RoundId, bool>,
}

impl Ledger {
    fn end(&mut self, lease: LeaseId) {
        self.held.retain(|_, held| *held != lease);
    }

    fn read(&mut self, records: Vec<Record>) -> Result<(), TestCaseError> {
        for record in records {
            match record {
                Record::RoundOpened { id, .. } => {
                    prop_assert!(
                        self.rounds.values().all(|ended| *ended),
                        "one round at a time"
                    );
                    prop_assert!(
                        self.rounds.insert(id, false).is_none(),
                        "round {id} opened twice"
                    );
                }
                Record::RoundClosed { id, outcome, .. } => {
                    prop_assert_eq!(self.rounds.insert(id, true), Some(false));
                    for lease in outcome.leases {
                        for gpu in lease.gpus {
                            prop_assert!(
                                self.held.insert(gpu, lease.id).is_none(),
                                "GPU {:?} leased twice",
                                gpu
                            );
                        }
                    }
                }
                Record::RoundAbandoned { id, .. } => {
                    prop_assert_eq!(self.rounds.insert(id, true), Some(false));
                }
                Record::LeasesExpired { leases } => leases.iter().for_each(|l| self.end(l.id)),
                Record::NoticeServed { revoked, .. } => revoked.iter().for_each(|l| self.end(l.id)),
                Record::HostsDown { hosts } => hosts
                    .iter()
                    .flat_map(|host| &host.revoked)
                    .for_each(|l| self.end(l.id)),
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_gpu_is_leased_twice_and_every_round_ends_once(steps in prop::collection::vec(step(), 1..40)) {
        // Hosts that heartbeat less often than every 600 s are lost now and then.
        let settings = LiveSettings {
            heartbeat_interval: Duration::from_secs(300),
            ..SETTINGS
        };
        let mut shell = Shell::with_settings(fresh(market_of_two_hosts()), settings);
        let mut ledger = Ledger::default();
        let mut arrivals = 0;
        for step in steps {
            if shell.halted.is_some() {
                let before = shell.records.len();
                shell.advance(Duration::from_secs(700));
                prop_assert_eq!(shell.records.len(), before, "nothing after a refused write");
                break;
            }
            match step {
                Step::Arrive { gpus, explicit } => {
                    arrivals += 1;
                    let bidding = if explicit { Bidding::Explicit } else { Bidding::Agent };
                    shell.register(&format!("app{arrivals}"), gpus, bidding);
                }
                Step::AgentsBid => shell.agents_bid(),
                Step::FrameworksBid => {
                    if let Some(round) = shell.live.open_round() {
                        let (id, gpu) = (round.id, round.offer.offer.offer.gpus[0].id.clone());
                        let explicit: Vec<AppId> = round
                            .offer
                            .bidders
                            .iter()
                            .filter(|app| shell.live.bidding(app) == Some(Bidding::Explicit))
                            .cloned()
                            .collect();
                        for app in explicit {
                            let bid = AppBid {
                                app,
                                rho_old: None,
                                bids: vec![BidEntry {
                                    gpus: vec![gpu.clone()],
                                    rho: Rho::new(2.0).expect("valid"),
                                }],
                            };
                            // Refused only as a second bid.
                            if let Err(error) = shell.feed(Event::FrameworkBid { round: id, bid }) {
                                prop_assert!(matches!(error, LiveError::AlreadyBid { .. }), "{}", error);
                            }
                        }
                    }
                }
                Step::Decide => shell.decide(),
                Step::Leave(n) => {
                    let apps: Vec<AppId> = shell.live.market().apps().map(|app| app.id.clone()).collect();
                    if let Some(app) = apps.get(n % apps.len().max(1)) {
                        let released: Vec<LeaseId> =
                            shell.live.market().leases().leases_of(app).map(|lease| lease.id).collect();
                        shell.leave(&app.0);
                        released.into_iter().for_each(|lease| ledger.end(lease));
                    }
                }
                Step::Advance(seconds) => shell.advance(Duration::from_secs(seconds)),
                Step::Drain(gpu) => {
                    let gpu = GpuIndex(gpu);
                    let notice = shell.live.notice_now(gpu, Withdrawal::Drained, "repair".into(), shell.now);
                    shell.feed(Event::NoticeGiven { gpu, notice }).expect("a notice");
                }
                Step::Heartbeat(first) => {
                    let host = if first { "h1" } else { "h2" };
                    shell.feed(Event::HostSeen { host: host.into() }).expect("a heartbeat");
                }
                Step::Refuse => {
                    shell.feed(Event::CommitRefused { reason: "refused".into() }).expect("halts");
                }
            }
            let records = shell.take_records();
            ledger.read(records)?;
            let active: BTreeSet<(GpuIndex, LeaseId)> = shell
                .live
                .market()
                .leases()
                .active()
                .flat_map(|lease| lease.gpus.iter().map(move |&gpu| (gpu, lease.id)))
                .collect();
            let recorded: BTreeSet<(GpuIndex, LeaseId)> =
                ledger.held.iter().map(|(&gpu, &lease)| (gpu, lease)).collect();
            prop_assert_eq!(active, recorded, "the records say what the market holds");
        }
        // Unless halted, every round opened ends once its deadline passes and its decision
        // is answered.
        if shell.halted.is_none() {
            shell.advance(Duration::from_secs(11));
            shell.decide();
            let records = shell.take_records();
            ledger.read(records)?;
            let open = shell.live.open_round().map(|round| round.id);
            prop_assert!(ledger.rounds.iter().all(|(id, ended)| *ended || Some(*id) == open));
        }
    }
}
