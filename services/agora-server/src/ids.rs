//! The service's ids, one type each, from the database row to the JSON: a round id cannot be
//! passed where an app id is wanted. Each is the row's `bigint` key, written as a plain number
//! in JSON and in paths. The engine names apps and leases its own way ([`AppId`], [`LeaseId`]);
//! the conversions between the two live here and nowhere else.

use std::fmt;

use agora_market::app::AppId;
use agora_market::lease::LeaseId;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

macro_rules! database_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            ToSchema, sqlx::Type,
        )]
        #[serde(transparent)]
        #[sqlx(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(formatter)
            }
        }
    };
}

database_id!(
    /// A tenant: who owns apps and sees their details (`tenants.id`).
    TenantId
);
database_id!(
    /// An app (`apps.id`); the engine knows it as the [`AppId`] of its decimal text.
    AppKey
);
database_id!(
    /// A round (`rounds.id`).
    RoundId
);
database_id!(
    /// One stored bid (`bids.id`).
    BidId
);
database_id!(
    /// A lease (`leases.id`); the engine's [`LeaseId`] with the same number.
    LeaseKey
);

impl From<AppKey> for AppId {
    fn from(key: AppKey) -> Self {
        AppId(key.0.to_string())
    }
}

impl TryFrom<&AppId> for AppKey {
    type Error = String;

    /// Every app the service admits is named by its database id; anything else is not one of
    /// the service's apps.
    fn try_from(app: &AppId) -> Result<Self, Self::Error> {
        app.0
            .parse()
            .map(Self)
            .map_err(|_| format!("app id {app} is not a database id"))
    }
}

impl From<LeaseId> for LeaseKey {
    /// The service issues lease ids from the database's sequence, so they fit a `bigint`.
    fn from(id: LeaseId) -> Self {
        Self(i64::try_from(id.0).expect("lease ids are issued from a bigint sequence"))
    }
}

impl LeaseKey {
    /// The engine's id for this lease; `None` for a number no lease can have (a negative one
    /// from a caller).
    pub fn lease_id(self) -> Option<LeaseId> {
        u64::try_from(self.0).ok().map(LeaseId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_keys_and_engine_app_ids_convert_both_ways() {
        assert_eq!(AppId::from(AppKey(42)), AppId::from("42"));
        assert_eq!(AppKey::try_from(&AppId::from("42")), Ok(AppKey(42)));
        assert!(AppKey::try_from(&AppId::from("vision")).is_err());
    }

    #[test]
    fn lease_keys_and_engine_lease_ids_convert_both_ways() {
        assert_eq!(LeaseKey::from(LeaseId(7)), LeaseKey(7));
        assert_eq!(LeaseKey(7).lease_id(), Some(LeaseId(7)));
        assert_eq!(LeaseKey(-1).lease_id(), None);
    }

    #[test]
    fn ids_are_plain_numbers_in_json() {
        assert_eq!(serde_json::to_string(&RoundId(3)).expect("serialises"), "3");
        assert_eq!(
            serde_json::from_str::<TenantId>("5").expect("a number"),
            TenantId(5)
        );
    }
}
