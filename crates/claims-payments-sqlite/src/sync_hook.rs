//! The one hook into the SQLite store's durability, for development: the product hands
//! it to the development crate through its `seams` module; production installs none.

/// Called on the syncer thread before every WAL sync; an error counts as a failed sync.
/// The extension point for tests: hold commits that are visible but not yet durable, or
/// make a sync fail. Production installs none.
pub trait SyncHook: Send + Sync {
    fn before_sync(&self) -> std::io::Result<()>;
}
