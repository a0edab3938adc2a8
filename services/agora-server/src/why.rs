//! "Why", in words: one sentence per app and round, built from what the round recorded (the
//! app's place in the standings, how many apps were offered GPUs, its bid, the
//! proportional-fair bundle, its payment share c, the GPUs it kept and the leftovers it got).
//! Pure, so every case is tested here; the dashboard shows it beside each round.

use crate::ids::RoundId;

/// What one round recorded about one app.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundFacts {
    pub round: RoundId,
    /// In the round's standings, worst rho first: the number of apps worse off.
    pub position: i32,
    /// rho at the round's start; `None`: starving (no GPU held, finish time unbounded).
    pub rho: Option<f64>,
    /// How many apps, the worst off, were offered GPUs in the round.
    pub offered_apps: usize,
    /// Whether this app was one of them.
    pub offered: bool,
    /// GPUs in the largest bundle of its bid; `None` when it did not bid.
    pub bid_gpus: Option<usize>,
    /// GPUs in the bundle the proportional-fair choice gave it; `None` when it gave none.
    pub pf_gpus: Option<usize>,
    /// Its hidden-payment share: it keeps this fraction of the proportional-fair bundle.
    pub c: Option<f64>,
    /// GPUs it kept from the auction.
    pub kept_gpus: usize,
    /// GPUs it received after the auction.
    pub leftover_gpus: usize,
}

/// "Round 812: you were among the 4 worst-off apps (ρ ∞) and bid for 2 GPUs; the auction gave
/// you 2 (you keep both: c = 1.000)", "Round 9: not offered: 11 apps were worse off (ρ 0.870);
/// you received 1 leftover GPU".
pub fn round_sentence(facts: &RoundFacts) -> String {
    let rho = rho_text(facts.rho);
    let mut sentence = format!("Round {}: ", facts.round);
    if facts.offered {
        let among = if facts.offered_apps <= 1 {
            "you were the worst-off app".to_owned()
        } else {
            format!("you were among the {} worst-off apps", facts.offered_apps)
        };
        sentence.push_str(&format!("{among} ({rho})"));
        match facts.bid_gpus {
            None => sentence.push_str(" and were offered GPUs, but did not bid"),
            Some(wanted) => {
                sentence.push_str(&format!(" and bid for {}; ", gpus(wanted)));
                sentence.push_str(&auction_outcome(facts));
            }
        }
    } else {
        let worse = match facts.position {
            1 => "1 app was worse off".to_owned(),
            position => format!("{position} apps were worse off"),
        };
        let offered = if facts.offered_apps == 1 {
            "only the worst-off app was offered GPUs".to_owned()
        } else {
            format!(
                "only the {} worst off were offered GPUs",
                facts.offered_apps
            )
        };
        sentence.push_str(&format!("not offered: {worse} ({rho}) and {offered}"));
    }
    if facts.leftover_gpus > 0 {
        sentence.push_str(&format!(
            "; you received {} leftover {}",
            facts.leftover_gpus,
            if facts.leftover_gpus == 1 {
                "GPU"
            } else {
                "GPUs"
            }
        ));
    }
    sentence
}

/// What the auction gave a bidder, and what its payment share let it keep.
fn auction_outcome(facts: &RoundFacts) -> String {
    let c = facts
        .c
        .map_or_else(|| "–".to_owned(), |c| format!("{c:.3}"));
    match facts.pf_gpus {
        None | Some(0) => {
            "the auction gave you none: the offered GPUs went to apps whose ρ they improved more"
                .to_owned()
        }
        Some(bundle) if facts.kept_gpus == 0 => format!(
            "the auction gave you {bundle}, but your hidden payment (c = {c}) left you none"
        ),
        Some(bundle) if facts.kept_gpus == bundle => {
            let keep = match bundle {
                1 => "you keep it".to_owned(),
                2 => "you keep both".to_owned(),
                all => format!("you keep all {all}"),
            };
            format!("the auction gave you {bundle} ({keep}: c = {c})")
        }
        Some(bundle) => format!(
            "the auction gave you {bundle} and you keep {} of them (c = {c})",
            facts.kept_gpus
        ),
    }
}

fn rho_text(rho: Option<f64>) -> String {
    rho.map_or_else(|| "ρ ∞".to_owned(), |rho| format!("ρ {rho:.3}"))
}

fn gpus(count: usize) -> String {
    if count == 1 {
        "1 GPU".to_owned()
    } else {
        format!("{count} GPUs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bidder(round: RoundId, rho: Option<f64>, offered_apps: usize) -> RoundFacts {
        RoundFacts {
            round,
            position: 0,
            rho,
            offered_apps,
            offered: true,
            bid_gpus: Some(2),
            pf_gpus: None,
            c: None,
            kept_gpus: 0,
            leftover_gpus: 0,
        }
    }

    #[test]
    fn a_won_round_names_the_offer_the_bid_the_bundle_and_the_share_kept() {
        let won = RoundFacts {
            pf_gpus: Some(2),
            c: Some(1.0),
            kept_gpus: 2,
            ..bidder(RoundId(812), None, 4)
        };
        assert_eq!(
            round_sentence(&won),
            "Round 812: you were among the 4 worst-off apps (ρ ∞) and bid for 2 GPUs; \
             the auction gave you 2 (you keep both: c = 1.000)"
        );
        let paid = RoundFacts {
            pf_gpus: Some(3),
            bid_gpus: Some(3),
            c: Some(0.7),
            kept_gpus: 2,
            ..bidder(RoundId(9), Some(1.25), 1)
        };
        assert_eq!(
            round_sentence(&paid),
            "Round 9: you were the worst-off app (ρ 1.250) and bid for 3 GPUs; \
             the auction gave you 3 and you keep 2 of them (c = 0.700)"
        );
    }

    #[test]
    fn a_lost_round_says_the_auction_gave_it_nothing_or_its_payment_took_it_all() {
        assert_eq!(
            round_sentence(&bidder(RoundId(40), Some(2.5), 3)),
            "Round 40: you were among the 3 worst-off apps (ρ 2.500) and bid for 2 GPUs; \
             the auction gave you none: the offered GPUs went to apps whose ρ they improved more"
        );
        let paid_away = RoundFacts {
            pf_gpus: Some(1),
            c: Some(0.4),
            ..bidder(RoundId(41), Some(2.5), 3)
        };
        assert_eq!(
            round_sentence(&paid_away),
            "Round 41: you were among the 3 worst-off apps (ρ 2.500) and bid for 2 GPUs; \
             the auction gave you 1, but your hidden payment (c = 0.400) left you none"
        );
    }

    #[test]
    fn leftovers_are_named_after_the_auction_whether_or_not_it_was_offered() {
        let lost_then_leftover = RoundFacts {
            leftover_gpus: 1,
            ..bidder(RoundId(7), None, 2)
        };
        assert!(round_sentence(&lost_then_leftover)
            .ends_with("the auction gave you none: the offered GPUs went to apps whose ρ they improved more; you received 1 leftover GPU"));
        let leftovers_only = RoundFacts {
            position: 11,
            offered: false,
            bid_gpus: None,
            leftover_gpus: 3,
            ..bidder(RoundId(812), Some(0.875), 4)
        };
        assert_eq!(
            round_sentence(&leftovers_only),
            "Round 812: not offered: 11 apps were worse off (ρ 0.875) and only the 4 worst off \
             were offered GPUs; you received 3 leftover GPUs"
        );
    }

    #[test]
    fn a_round_it_was_not_offered_counts_the_apps_worse_off() {
        let not_offered = RoundFacts {
            position: 1,
            offered: false,
            bid_gpus: None,
            ..bidder(RoundId(3), Some(0.5), 1)
        };
        assert_eq!(
            round_sentence(&not_offered),
            "Round 3: not offered: 1 app was worse off (ρ 0.500) and only the worst-off app was offered GPUs"
        );
        let silent = RoundFacts {
            bid_gpus: None,
            ..bidder(RoundId(4), None, 2)
        };
        assert_eq!(
            round_sentence(&silent),
            "Round 4: you were among the 2 worst-off apps (ρ ∞) and were offered GPUs, but did not bid"
        );
    }
}
