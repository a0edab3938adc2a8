//! Leases: an app's exclusive hold on a set of GPUs for a while (Themis §3.3.2). A pure state
//! machine: granted leases are active until they expire, are released early, or are revoked
//! because a GPU was lost. Invariant: a GPU is in at most one active lease.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::app::AppId;
use crate::time::Timestamp;
use crate::topology::GpuIndex;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    Active,
    /// Ran to its end.
    Expired,
    /// Given back early by the app.
    Released,
    /// Taken back because one of its GPUs was lost.
    Revoked,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub id: LeaseId,
    pub app: AppId,
    pub gpus: Vec<GpuIndex>,
    pub start: Timestamp,
    pub end: Timestamp,
    pub state: LeaseState,
    /// When it stopped being active (its end, or earlier if released or revoked).
    pub ended_at: Option<Timestamp>,
}

impl Lease {
    /// GPU-seconds the lease has held its GPUs from its start until `until`.
    pub fn gpu_seconds_until(&self, until: Timestamp) -> f64 {
        self.gpus.len() as f64 * until.saturating_since(self.start).as_secs_f64()
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeaseError {
    #[error("GPU {gpu:?} is already held by active lease {holder:?}")]
    GpuAlreadyLeased { gpu: GpuIndex, holder: LeaseId },
    #[error("a lease must hold at least one GPU")]
    NoGpus,
    #[error("a lease must last longer than zero")]
    ZeroLength,
    #[error("lease {0:?} is not active (unknown, or already ended)")]
    NotActive(LeaseId),
}

/// The active leases, indexed by GPU and by end time.
#[derive(Debug, Clone, Default)]
pub struct LeaseBook {
    active: BTreeMap<LeaseId, Lease>,
    holder: HashMap<GpuIndex, LeaseId>,
    by_app: HashMap<AppId, BTreeSet<LeaseId>>,
    by_end: BTreeSet<(Timestamp, LeaseId)>,
    next_id: u64,
}

impl LeaseBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Grants `app` the `gpus` from `start` for `length`. Fails, changing nothing, if any GPU
    /// is already leased.
    pub fn grant(
        &mut self,
        app: AppId,
        gpus: Vec<GpuIndex>,
        start: Timestamp,
        length: Duration,
    ) -> Result<LeaseId, LeaseError> {
        if gpus.is_empty() {
            return Err(LeaseError::NoGpus);
        }
        if length.is_zero() {
            return Err(LeaseError::ZeroLength);
        }
        if let Some((&gpu, &holder)) = gpus.iter().find_map(|gpu| self.holder.get_key_value(gpu)) {
            return Err(LeaseError::GpuAlreadyLeased { gpu, holder });
        }
        let id = LeaseId(self.next_id);
        self.next_id += 1;
        let end = start.saturating_add(length);
        self.insert(Lease {
            id,
            app,
            gpus,
            start,
            end,
            state: LeaseState::Active,
            ended_at: None,
        });
        Ok(id)
    }

    /// Restores an active lease recorded elsewhere (after a restart), keeping its id.
    pub fn restore(&mut self, lease: Lease) -> Result<(), LeaseError> {
        if let Some((&gpu, &holder)) = lease
            .gpus
            .iter()
            .find_map(|gpu| self.holder.get_key_value(gpu))
        {
            return Err(LeaseError::GpuAlreadyLeased { gpu, holder });
        }
        self.next_id = self.next_id.max(lease.id.0 + 1);
        self.insert(Lease {
            state: LeaseState::Active,
            ended_at: None,
            ..lease
        });
        Ok(())
    }

    /// New leases get ids from `next` on (or later, if ids beyond it are already taken).
    pub fn issue_ids_from(&mut self, next: LeaseId) {
        self.next_id = self.next_id.max(next.0);
    }

    fn insert(&mut self, lease: Lease) {
        for &gpu in &lease.gpus {
            self.holder.insert(gpu, lease.id);
        }
        self.by_end.insert((lease.end, lease.id));
        self.by_app
            .entry(lease.app.clone())
            .or_default()
            .insert(lease.id);
        self.active.insert(lease.id, lease);
    }

    fn end(&mut self, id: LeaseId, state: LeaseState, at: Timestamp) -> Result<Lease, LeaseError> {
        let mut lease = self.active.remove(&id).ok_or(LeaseError::NotActive(id))?;
        for gpu in &lease.gpus {
            self.holder.remove(gpu);
        }
        self.by_end.remove(&(lease.end, id));
        if let Some(ids) = self.by_app.get_mut(&lease.app) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_app.remove(&lease.app);
            }
        }
        lease.state = state;
        lease.ended_at = Some(at.min(lease.end));
        Ok(lease)
    }

    /// Ends every lease whose end is at or before `now`, earliest first.
    pub fn expire_due(&mut self, now: Timestamp) -> Vec<Lease> {
        let due: Vec<(Timestamp, LeaseId)> = self
            .by_end
            .range(..=(now, LeaseId(u64::MAX)))
            .copied()
            .collect();
        due.into_iter()
            .filter_map(|(end, id)| self.end(id, LeaseState::Expired, end).ok())
            .collect()
    }

    /// The app gives a lease back before its end.
    pub fn release(&mut self, id: LeaseId, now: Timestamp) -> Result<Lease, LeaseError> {
        self.end(id, LeaseState::Released, now)
    }

    /// A GPU was lost: the lease holding it, if any, is revoked.
    pub fn revoke_gpu(&mut self, gpu: GpuIndex, now: Timestamp) -> Option<Lease> {
        let id = *self.holder.get(&gpu)?;
        self.end(id, LeaseState::Revoked, now).ok()
    }

    pub fn get(&self, id: LeaseId) -> Option<&Lease> {
        self.active.get(&id)
    }

    pub fn holder_of(&self, gpu: GpuIndex) -> Option<&Lease> {
        self.holder.get(&gpu).and_then(|id| self.active.get(id))
    }

    pub fn is_leased(&self, gpu: GpuIndex) -> bool {
        self.holder.contains_key(&gpu)
    }

    pub fn active(&self) -> impl Iterator<Item = &Lease> {
        self.active.values()
    }

    pub fn leases_of<'a>(&'a self, app: &'a AppId) -> impl Iterator<Item = &'a Lease> {
        self.by_app
            .get(app)
            .into_iter()
            .flatten()
            .filter_map(|id| self.active.get(id))
    }

    /// The earliest end of an active lease: when the next resource-available event is due.
    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.by_end.first().map(|&(end, _)| end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn gpus(indices: &[u32]) -> Vec<GpuIndex> {
        indices.iter().map(|&i| GpuIndex(i)).collect()
    }

    #[test]
    fn lease_lifecycle() {
        let mut book = LeaseBook::new();
        let app = AppId::from("a");
        let first = book
            .grant(app.clone(), gpus(&[0, 1]), Timestamp(0), MINUTE)
            .expect("free gpus");
        let overlap = book.grant(app.clone(), gpus(&[1, 2]), Timestamp(0), MINUTE);
        assert_eq!(
            overlap,
            Err(LeaseError::GpuAlreadyLeased {
                gpu: GpuIndex(1),
                holder: first
            })
        );
        assert!(
            !book.is_leased(GpuIndex(2)),
            "a failed grant changes nothing"
        );
        let second = book
            .grant(app.clone(), gpus(&[2]), Timestamp(1000), MINUTE)
            .expect("free gpu");
        assert_eq!(book.next_expiry(), Some(Timestamp(60_000)));
        let expired = book.expire_due(Timestamp(60_500));
        assert_eq!(
            expired.iter().map(|l| (l.id, l.state)).collect::<Vec<_>>(),
            vec![(first, LeaseState::Expired)]
        );
        assert_eq!(expired[0].ended_at, Some(Timestamp(60_000)));
        let released = book.release(second, Timestamp(30_000)).expect("active");
        assert_eq!(
            (released.state, released.ended_at),
            (LeaseState::Released, Some(Timestamp(30_000)))
        );
        assert_eq!(
            book.release(second, Timestamp(30_000)),
            Err(LeaseError::NotActive(second))
        );
        assert_eq!(book.active().count(), 0);
    }

    #[test]
    fn losing_a_gpu_revokes_its_lease() {
        let mut book = LeaseBook::new();
        let id = book
            .grant(AppId::from("a"), gpus(&[3, 4]), Timestamp(0), MINUTE)
            .expect("free");
        let revoked = book.revoke_gpu(GpuIndex(4), Timestamp(5)).expect("held");
        assert_eq!((revoked.id, revoked.state), (id, LeaseState::Revoked));
        assert!(!book.is_leased(GpuIndex(3)), "the whole lease ends");
        assert!(book.revoke_gpu(GpuIndex(4), Timestamp(6)).is_none());
    }

    #[test]
    fn rejects_empty_and_zero_length_leases() {
        let mut book = LeaseBook::new();
        assert_eq!(
            book.grant(AppId::from("a"), vec![], Timestamp(0), MINUTE),
            Err(LeaseError::NoGpus)
        );
        assert_eq!(
            book.grant(AppId::from("a"), gpus(&[0]), Timestamp(0), Duration::ZERO),
            Err(LeaseError::ZeroLength)
        );
    }

    #[derive(Debug, Clone)]
    enum Operation {
        Grant {
            gpus: Vec<u32>,
            at: u64,
            minutes: u64,
        },
        Expire {
            at: u64,
        },
        Release {
            lease: u64,
            at: u64,
        },
        Revoke {
            gpu: u32,
            at: u64,
        },
    }

    fn operation() -> impl Strategy<Value = Operation> {
        prop_oneof![
            (prop::collection::vec(0u32..8, 1..4), 0u64..100, 1u64..5)
                .prop_map(|(gpus, at, minutes)| Operation::Grant { gpus, at, minutes }),
            (0u64..400).prop_map(|at| Operation::Expire { at }),
            (0u64..20, 0u64..100).prop_map(|(lease, at)| Operation::Release { lease, at }),
            (0u32..8, 0u64..100).prop_map(|(gpu, at)| Operation::Revoke { gpu, at }),
        ]
    }

    proptest! {
        /// Whatever happens, no GPU is ever in two active leases, and the GPU index agrees with
        /// the leases.
        #[test]
        fn a_gpu_is_in_at_most_one_active_lease(operations in prop::collection::vec(operation(), 1..60)) {
            let mut book = LeaseBook::new();
            for operation in operations {
                match operation {
                    Operation::Grant { mut gpus, at, minutes } => {
                        gpus.sort_unstable();
                        gpus.dedup();
                        let _ = book.grant(AppId::from("a"), gpus.into_iter().map(GpuIndex).collect(), Timestamp(at * 1000), MINUTE * minutes as u32);
                    }
                    Operation::Expire { at } => {
                        for lease in book.expire_due(Timestamp(at * 1000)) {
                            prop_assert!(lease.end <= Timestamp(at * 1000));
                        }
                    }
                    Operation::Release { lease, at } => { let _ = book.release(LeaseId(lease), Timestamp(at * 1000)); }
                    Operation::Revoke { gpu, at } => { let _ = book.revoke_gpu(GpuIndex(gpu), Timestamp(at * 1000)); }
                }
                let mut seen = std::collections::HashSet::new();
                for lease in book.active() {
                    prop_assert_eq!(lease.state, LeaseState::Active);
                    for &gpu in &lease.gpus {
                        prop_assert!(seen.insert(gpu), "gpu {:?} in two active leases", gpu);
                        prop_assert_eq!(book.holder_of(gpu).map(|l| l.id), Some(lease.id));
                    }
                }
                prop_assert_eq!(seen.len(), book.holder.len());
                let indexed: usize = book.by_app.values().map(BTreeSet::len).sum();
                prop_assert_eq!(indexed, book.active.len());
            }
        }
    }
}
