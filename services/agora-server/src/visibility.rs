//! The one rule of who sees what (ARCHITECTURE.md, "Tenants see only their own"). The admin
//! sees everything. A tenant sees its own apps in full, and other tenants' apps only as
//! anonymous participants: no ids, names, leases or bid details; another tenant's app is not
//! found at all. The API's checks of an app's owner, the arbiter's, and the store's reads of
//! rounds, the cluster, fairness and the lease timeline all ask [`Caller`].

use crate::ids::TenantId;

/// Who is asking: the admin, or a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Tenant(TenantId),
}

impl Caller {
    /// The caller as the arbiter's requests name it: the tenant asking, `None` for the admin.
    pub fn from_tenant(tenant: Option<TenantId>) -> Self {
        tenant.map_or(Self::Admin, Self::Tenant)
    }

    /// The tenant whose apps alone this caller sees; `None` for the admin. A query listing only
    /// what the caller sees filters on it with `$1::bigint IS NULL OR tenant_id = $1`, which
    /// is [`Caller::sees`] in SQL.
    pub fn tenant(self) -> Option<TenantId> {
        match self {
            Self::Admin => None,
            Self::Tenant(tenant) => Some(tenant),
        }
    }

    /// Whether this caller sees in full (and may act for) what tenant `owner` owns.
    pub fn sees(self, owner: TenantId) -> bool {
        match self {
            Self::Admin => true,
            Self::Tenant(tenant) => tenant == owner,
        }
    }

    /// `detail` of something tenant `owner` owns, if this caller sees it; `None` hides it.
    pub fn reveal<T>(self, owner: TenantId, detail: T) -> Option<T> {
        self.sees(owner).then_some(detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VISION: TenantId = TenantId(1);
    const SPEECH: TenantId = TenantId(2);

    #[test]
    fn the_admin_sees_every_tenants_apps() {
        for owner in [VISION, SPEECH] {
            assert!(Caller::Admin.sees(owner));
            assert_eq!(Caller::Admin.reveal(owner, "tuner"), Some("tuner"));
        }
    }

    #[test]
    fn a_tenant_sees_its_own_apps_and_no_other_tenants() {
        let vision = Caller::Tenant(VISION);
        assert!(vision.sees(VISION));
        assert!(!vision.sees(SPEECH));
        assert_eq!(vision.reveal(VISION, 7), Some(7));
        assert_eq!(vision.reveal(SPEECH, 7), None);
    }

    #[test]
    fn the_arbiters_naming_of_the_caller_is_the_same_caller() {
        for caller in [Caller::Admin, Caller::Tenant(VISION)] {
            assert_eq!(Caller::from_tenant(caller.tenant()), caller);
        }
    }
}
