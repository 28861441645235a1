//! A [`SyncHook`] for the SQLite store that tests steer: hold every WAL sync (a commit
//! that is visible but not yet durable) or make the next one fail.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use claims_payments_sqlite::SyncHook;

#[derive(Default)]
pub struct SyncGate {
    paused: Mutex<bool>,
    resumed: Condvar,
    fail_next: Mutex<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Syncs resume when this drops.
pub struct SyncPause(Arc<SyncGate>);

impl Drop for SyncPause {
    fn drop(&mut self) {
        *lock(&self.0.paused) = false;
        self.0.resumed.notify_all();
    }
}

impl SyncGate {
    pub fn new() -> Arc<Self> {
        Arc::new(SyncGate::default())
    }

    /// Holds back every WAL sync, and so every answer that needs one, until the returned
    /// value drops.
    pub fn pause(self: &Arc<Self>) -> SyncPause {
        *lock(&self.paused) = true;
        SyncPause(self.clone())
    }

    /// The next WAL sync fails as an `fdatasync` error would.
    pub fn fail_next(&self) {
        *lock(&self.fail_next) = true;
    }
}

impl SyncHook for SyncGate {
    fn before_sync(&self) -> std::io::Result<()> {
        drop(
            self.resumed
                .wait_while(lock(&self.paused), |paused| *paused)
                .unwrap_or_else(PoisonError::into_inner),
        );
        if std::mem::take(&mut *lock(&self.fail_next)) {
            return Err(std::io::Error::other("injected fdatasync failure"));
        }
        Ok(())
    }
}
