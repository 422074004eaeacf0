//! Fair shares of a listener's long-held slots between its credentials: the web view's live
//! streams (`max_clients`), which hold their connections for as long as the reader stays.
//!
//! Without shares, the first credential to open `max_clients` streams shuts every other reader
//! out (`503`) — a tenant could blind the admin and the other tenants. With them:
//!
//! - the **admin** (the listener's `auth`, or everyone when no credential is configured) may take
//!   any free slot, and a quarter of the slots (at least one) are the admin's alone: the tenants
//!   together never hold more than `total − reserve`, so the admin always has room;
//! - **each tenant** holds at most its share, `(total − reserve) / tenants` (at least one), so
//!   one tenant at its share leaves every other tenant its own.
//!
//! With the defaults (128 streams) and two tenants: 32 reserved for the admin, 48 per tenant.
//!
//! The listener's other limit, `max_connections`, needs no share: a connection is only pinned
//! while it carries a live stream (bounded here, per credential); any other connection — idle
//! keep-alive, silent, slow — is closed to make room for a newcomer (`server`'s admission), and
//! a request is answered in well under a millisecond, so no credential can hold connection slots
//! against the others.

use std::sync::{Arc, Mutex, PoisonError};

/// Who holds a slot: the admin, or the tenant at this index (its position in the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    Admin,
    Tenant(usize),
}

impl Holder {
    /// The holder of a request's scope (`None`: the admin's view).
    pub(crate) fn of(scope: Option<usize>) -> Self {
        scope.map_or(Holder::Admin, Holder::Tenant)
    }
}

/// Why a slot was refused: the message of the `503`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// Every slot is taken.
    #[error("too many live clients ({0} at most)")]
    Full(usize),
    /// The tenant holds its share.
    #[error("too many live clients for this credential (its share is {0})")]
    TenantShare(usize),
    /// The tenants together hold every slot that is not the admin's.
    #[error("too many live clients for tenants ({0} together at most)")]
    Tenants(usize),
}

#[derive(Debug)]
struct Counts {
    admin: usize,
    tenants: Vec<usize>,
}

/// The slots of one listener and who holds them. Cloning shares the counts.
#[derive(Clone, Debug)]
pub(crate) struct Shares {
    total: usize,
    /// Most slots the tenants hold together.
    tenants_max: usize,
    /// Most slots one tenant holds.
    share: usize,
    counts: Arc<Mutex<Counts>>,
}

impl Shares {
    /// `total` slots (at least 1) shared between the admin and `tenants` tenants.
    pub(crate) fn new(total: usize, tenants: usize) -> Self {
        let total = total.max(1);
        let reserve = (total / 4).max(1);
        let tenants_max = total.saturating_sub(reserve);
        let share = tenants_max.checked_div(tenants).map_or(0, |s| s.max(1).min(tenants_max));
        Self { total, tenants_max, share, counts: Arc::new(Mutex::new(Counts { admin: 0, tenants: vec![0; tenants] })) }
    }

    /// Most slots one tenant may hold.
    #[cfg(test)]
    pub(crate) fn share(&self) -> usize {
        self.share
    }

    /// A slot for `holder`, given back when the [`Lease`] is dropped.
    pub(crate) fn take(&self, holder: Holder) -> Result<Lease, Refused> {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let tenants: usize = c.tenants.iter().sum();
        if c.admin + tenants >= self.total {
            return Err(Refused::Full(self.total));
        }
        match holder {
            Holder::Admin => c.admin += 1,
            Holder::Tenant(i) => {
                // A scope that is no configured tenant cannot happen (scopes come from the same
                // configuration); refuse rather than count it nowhere.
                let share = self.share;
                let Some(held) = c.tenants.get_mut(i) else { return Err(Refused::TenantShare(0)) };
                if *held >= share {
                    return Err(Refused::TenantShare(share));
                }
                if tenants >= self.tenants_max {
                    return Err(Refused::Tenants(self.tenants_max));
                }
                *held += 1;
            }
        }
        Ok(Lease { counts: Arc::clone(&self.counts), holder })
    }

    /// Slots held now by `holder`.
    #[cfg(test)]
    pub(crate) fn held(&self, holder: Holder) -> usize {
        let c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        match holder {
            Holder::Admin => c.admin,
            Holder::Tenant(i) => c.tenants.get(i).copied().unwrap_or(0),
        }
    }
}

/// One held slot; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct Lease {
    counts: Arc<Mutex<Counts>>,
    holder: Holder,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        match self.holder {
            Holder::Admin => c.admin = c.admin.saturating_sub(1),
            Holder::Tenant(i) => {
                if let Some(n) = c.tenants.get_mut(i) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(shares: &Shares, holder: Holder) -> Vec<Lease> {
        std::iter::from_fn(|| shares.take(holder).ok()).take(10_000).collect()
    }

    #[test]
    fn a_tenant_holds_its_share_and_the_admin_always_has_room() {
        let shares = Shares::new(128, 2);
        assert_eq!(shares.share(), 48);
        let alice = fill(&shares, Holder::Tenant(0));
        assert_eq!(alice.len(), 48);
        assert_eq!(shares.take(Holder::Tenant(0)).unwrap_err(), Refused::TenantShare(48));
        let bob = fill(&shares, Holder::Tenant(1));
        assert_eq!(bob.len(), 48);
        // The tenants at their shares: the admin still has the reserve and the rest.
        let admin = fill(&shares, Holder::Admin);
        assert_eq!(admin.len(), 32);
        assert_eq!(shares.take(Holder::Admin).unwrap_err(), Refused::Full(128));
        // A slot given back is anyone's again.
        drop(alice);
        assert_eq!(shares.held(Holder::Tenant(0)), 0);
        assert_eq!(fill(&shares, Holder::Tenant(0)).len(), 48);
    }

    #[test]
    fn the_admin_may_take_what_tenants_leave_but_tenants_never_the_reserve() {
        let shares = Shares::new(8, 1);
        assert_eq!(shares.share(), 6);
        let admin = fill(&shares, Holder::Admin);
        assert_eq!(admin.len(), 8, "no tenant holds anything: the admin takes every slot");
        assert_eq!(shares.take(Holder::Tenant(0)).unwrap_err(), Refused::Full(8));
        drop(admin);
        let tenant = fill(&shares, Holder::Tenant(0));
        assert_eq!(tenant.len(), 6);
        assert_eq!(fill(&shares, Holder::Admin).len(), 2);
    }

    #[test]
    fn many_tenants_each_get_one_and_together_stay_out_of_the_reserve() {
        let shares = Shares::new(4, 10);
        assert_eq!(shares.share(), 1);
        let held: Vec<Lease> = (0..10).filter_map(|i| shares.take(Holder::Tenant(i)).ok()).collect();
        assert_eq!(held.len(), 3, "tenants together: 4 − 1 reserved");
        assert_eq!(shares.take(Holder::Tenant(9)).unwrap_err(), Refused::Tenants(3));
        assert!(shares.take(Holder::Admin).is_ok());
        // Without tenants everything is the admin's; one slot is one slot.
        assert_eq!(fill(&Shares::new(1, 0), Holder::Admin).len(), 1);
        assert_eq!(fill(&Shares::new(1, 1), Holder::Tenant(0)).len(), 0, "the only slot is the admin's reserve");
        assert_eq!(Shares::new(5, 1).take(Holder::Tenant(7)).unwrap_err(), Refused::TenantShare(0));
    }
}
