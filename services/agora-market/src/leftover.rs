//! Leftovers: offered GPUs that no bidder keeps after the auction (hidden payments plus GPUs no
//! PF bundle used). Themis §3.3.2 gives them at random to the apps that did not bid, which
//! keeps the mechanism work-conserving; Agora gives them to the worst off first.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::app::AppId;
use crate::auction::OfferedGpu;
use crate::topology::{GpuId, GpuLocation, PlacementIndex};

/// Who gets the leftovers of an auction. A named policy so the variants can be compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeftoverPolicy {
    /// To the active apps that did not bid and still have unmet demand, worst rho first, each
    /// taking the GPUs its lease just ended on, then the best-placed leftovers for what it
    /// holds. Non-bidders are better off than every bidder, so this continues the round's order.
    #[default]
    WorstFirst,
    /// The paper's rule: at random (seeded) to active apps that did not bid and still have
    /// unmet demand, each taking the best-placed leftovers for what it holds.
    RandomToNonBidders,
    /// The authors' simulator: re-auction the leftovers among the next-worst apps by rho that
    /// did not bid, repeatedly, until nothing is left or nobody is left.
    ReauctionNextWorst,
}

/// An app that may receive leftovers.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipient {
    pub app: AppId,
    pub unmet_demand: usize,
    /// Where its GPUs are (and were, until their lease ended), so its leftovers are picked near
    /// them.
    pub holds: Vec<GpuLocation>,
    /// GPUs whose lease it held until this round: it takes back those still left first.
    pub claimed: Vec<GpuId>,
}

/// Hands `leftover` out to `recipients` in the order given, each taking up to its unmet demand:
/// first the GPUs it claimed (a renewal keeps a job where it runs), then the best-placed
/// remaining GPUs. Returns what each got; `leftover` keeps what is left.
pub fn hand_out_in_order(
    leftover: &mut Vec<OfferedGpu>,
    recipients: &[Recipient],
) -> BTreeMap<AppId, Vec<GpuId>> {
    let mut granted = BTreeMap::new();
    for recipient in recipients {
        if leftover.is_empty() {
            break;
        }
        let count = recipient.unmet_demand.min(leftover.len());
        if count == 0 {
            continue;
        }
        let mut gpus = take_claimed(leftover, &recipient.claimed, count);
        if gpus.len() < count {
            let placement = PlacementIndex::new(leftover.iter().map(|gpu| gpu.location).collect());
            let mut chosen = placement.best_subset(count - gpus.len(), &recipient.holds);
            chosen.sort_unstable_by(|a, b| b.cmp(a));
            let mut placed: Vec<GpuId> = chosen
                .into_iter()
                .map(|item| leftover.remove(item).id)
                .collect();
            placed.reverse();
            gpus.extend(placed);
        }
        granted.insert(recipient.app.clone(), gpus);
    }
    granted
}

/// Removes from `leftover` up to `count` of the `claimed` GPUs, in leftover order.
fn take_claimed(leftover: &mut Vec<OfferedGpu>, claimed: &[GpuId], count: usize) -> Vec<GpuId> {
    let mut taken = Vec::new();
    leftover.retain(|gpu| {
        let take = taken.len() < count && claimed.contains(&gpu.id);
        if take {
            taken.push(gpu.id.clone());
        }
        !take
    });
    taken
}

/// The paper's rule: recipients in a random order drawn from `rng`.
pub fn hand_out_at_random(
    leftover: &mut Vec<OfferedGpu>,
    mut recipients: Vec<Recipient>,
    rng: &mut ChaCha8Rng,
) -> BTreeMap<AppId, Vec<GpuId>> {
    recipients.sort_by(|a, b| a.app.cmp(&b.app));
    recipients.shuffle(rng);
    hand_out_in_order(leftover, &recipients)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn gpu(id: &str, machine: u32) -> OfferedGpu {
        OfferedGpu {
            id: GpuId::from(id),
            location: GpuLocation {
                rack: 0,
                machine,
                slot: machine,
            },
            interchange_class: machine,
        }
    }

    fn recipient(app: &str, unmet_demand: usize, holds: &[u32]) -> Recipient {
        let holds = holds
            .iter()
            .map(|&m| GpuLocation {
                rack: 0,
                machine: m,
                slot: m,
            })
            .collect();
        Recipient {
            app: AppId::from(app),
            unmet_demand,
            holds,
            claimed: Vec::new(),
        }
    }

    #[test]
    fn hands_out_near_what_each_app_holds_up_to_its_demand() {
        let mut leftover = vec![gpu("a0", 0), gpu("b0", 1), gpu("b1", 1), gpu("c0", 2)];
        let granted = hand_out_in_order(
            &mut leftover,
            &[recipient("x", 2, &[1]), recipient("y", 5, &[])],
        );
        assert_eq!(
            granted[&AppId::from("x")],
            vec![GpuId::from("b0"), GpuId::from("b1")]
        );
        assert_eq!(granted[&AppId::from("y")].len(), 2);
        assert!(leftover.is_empty());
    }

    #[test]
    fn a_recipient_takes_back_its_claimed_gpus_first() {
        let mut leftover = vec![gpu("a0", 0), gpu("b0", 1), gpu("b1", 1), gpu("c0", 2)];
        let renewing = Recipient {
            claimed: vec![GpuId::from("c0"), GpuId::from("a0")],
            ..recipient("x", 3, &[1])
        };
        let granted = hand_out_in_order(&mut leftover, &[renewing]);
        assert_eq!(
            granted[&AppId::from("x")],
            vec![GpuId::from("a0"), GpuId::from("c0"), GpuId::from("b0")],
            "both claimed GPUs, then the best placed near what it holds"
        );
        assert_eq!(leftover.len(), 1);
    }

    #[test]
    fn random_order_is_seeded() {
        let recipients: Vec<Recipient> = (0..6)
            .map(|n| recipient(&format!("app{n}"), 1, &[]))
            .collect();
        let run = |seed| {
            let mut leftover = vec![gpu("a0", 0), gpu("b0", 1)];
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            hand_out_at_random(&mut leftover, recipients.clone(), &mut rng)
        };
        assert_eq!(run(7), run(7));
        let winners: std::collections::BTreeSet<Vec<AppId>> = (0..20)
            .map(|seed| run(seed).into_keys().collect())
            .collect();
        assert!(
            winners.len() > 1,
            "different seeds pick different recipients"
        );
    }
}
