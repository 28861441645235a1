//! The one hook into the SQLite store's durability. Reached from outside only through
//! the `seams` module.

/// Called on the syncer thread before every WAL sync; an error counts as a failed sync.
/// The extension point for tests: hold commits that are visible but not yet durable, or
/// make a sync fail. Production installs none.
pub trait SyncHook: Send + Sync {
    fn before_sync(&self) -> std::io::Result<()>;
}
