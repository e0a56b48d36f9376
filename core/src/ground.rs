//! The ground floor: small helpers every layer of the control side may use
//! (time as numbers for logs and statuses, locks that survive a panic).
//! It imports nothing of this crate.

use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

/// Locks, recovering from a poisoned lock (the data is plain records).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A duration as whole microseconds, for a log field or a status.
pub fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Seconds since the epoch.
pub fn now_epoch() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
