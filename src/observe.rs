//! Observers of domain events.
//!
//! The cores (the actuators, the protective stop, the world's sensor
//! values, the store) publish what happens as typed events, each to the
//! observers it was given when it was built: the audit writer, the
//! recording, the metrics (and later the live views). The daemon composes
//! those lists once, in one place (`daemon::Observers`); nothing is wired
//! after construction, so no setup order can lose an event.
//!
//! An observer is called synchronously, in the order of the events, from
//! the core's own path (often under its lock): it must not block. Slow work
//! goes behind a bounded queue (the recording) or a channel to a task of
//! its own (the audit writer).

use std::sync::Arc;

/// The observers of one kind of event (`O` is the observer trait object,
/// e.g. `dyn ActuatorObserver`). Cheap to clone.
pub struct Observers<O: ?Sized>(Arc<[Arc<O>]>);

impl<O: ?Sized> Observers<O> {
    pub fn new(observers: Vec<Arc<O>>) -> Self {
        Observers(observers.into())
    }

    /// Each observer, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = &O> {
        self.0.iter().map(|o| &**o)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<O: ?Sized> Default for Observers<O> {
    fn default() -> Self {
        Observers(Arc::new([]))
    }
}

impl<O: ?Sized> Clone for Observers<O> {
    fn clone(&self) -> Self {
        Observers(self.0.clone())
    }
}

impl<O: ?Sized> std::fmt::Debug for Observers<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

impl<O: ?Sized> From<Vec<Arc<O>>> for Observers<O> {
    fn from(observers: Vec<Arc<O>>) -> Self {
        Observers::new(observers)
    }
}
