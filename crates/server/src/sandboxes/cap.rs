//! The per-tenant cap on sandboxes. A create takes a [`Seat`] before it makes its
//! sandbox and holds it until the sandbox is listed (or the create fails): the count of
//! a tenant's sandboxes and seats, and the taking of one, happen under the same locks,
//! so concurrent creates cannot all pass the check (they did when the count and the
//! insert were apart: eight racing creates against a cap of three made eight).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::problem::{ApiError, Code};

use super::Inner;

/// Creates in flight, per tenant.
pub(super) type Creating = Mutex<HashMap<String, usize>>;

/// A place under `tenant`'s cap while its sandbox is made; given back when dropped.
pub(super) struct Seat<'a> {
    creating: &'a Creating,
    tenant: String,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut c = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.tenant);
            }
        }
    }
}

/// A seat for `tenant`, or 429 when its sandboxes and creates in flight are at the cap.
pub(super) fn take_seat<'a>(inner: &'a Inner, tenant: &str) -> Result<Seat<'a>, ApiError> {
    // Locks in this order everywhere: the sandboxes, then the creates in flight.
    let all = inner.lock();
    let mut creating = inner.creating.lock().unwrap_or_else(|p| p.into_inner());
    let held = all.len_of(tenant) + creating.get(tenant).copied().unwrap_or(0);
    if held >= inner.max_per_tenant {
        return Err(ApiError::new(
            Code::QuotaExceeded,
            format!(
                "tenant {tenant:?} has {held} sandboxes, the most this server allows; kill one first"
            ),
        ));
    }
    *creating.entry(tenant.to_string()).or_default() += 1;
    Ok(Seat {
        creating: &inner.creating,
        tenant: tenant.to_string(),
    })
}
