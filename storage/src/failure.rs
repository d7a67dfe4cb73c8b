//! A failure's cause, held where a log or file keeps it, and counted per thread.
//!
//! At 10,000 partitions "is this log failed?" (asked per partition of every Produce and
//! Fetch, and by the passes over every log) followed the log's active segment to its
//! file's state: cold cache lines a partition, a tenth of a follower's CPU (issue 40).
//! Every [`Slot`] that holds a cause counts itself in its thread's tally, so while no
//! log or file of the thread (a shard) is failed, [`any`] answers with one
//! thread-local read and the per-log question need not be asked at all. A slot is
//! created, set and dropped on its owner's thread (logs and files are `Rc`s).

use std::cell::Cell;

thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// Whether any slot of this thread holds a cause now.
pub fn any() -> bool {
    HELD.with(|h| h.get() > 0)
}

/// Where a log or file keeps why it failed; empty while it works.
#[derive(Debug, Default)]
pub struct Slot(Option<String>);

impl Slot {
    pub fn get(&self) -> Option<&String> {
        self.0.as_ref()
    }

    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// Holds `cause` (replacing one held already).
    pub fn set(&mut self, cause: String) {
        if self.0.is_none() {
            HELD.with(|h| h.set(h.get() + 1));
        }
        self.0 = Some(cause);
    }

    pub fn clear(&mut self) {
        if self.0.take().is_some() {
            HELD.with(|h| h.set(h.get() - 1));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_held_causes_until_cleared_or_dropped() {
        assert!(!any());
        let mut a = Slot::default();
        let mut b = Slot::default();
        a.set("one".into());
        a.set("again".into());
        b.set("two".into());
        assert!(any());
        a.clear();
        assert!(any(), "b still holds one");
        assert_eq!(b.get().map(String::as_str), Some("two"));
        drop(b);
        assert!(!any());
        a.clear();
        assert!(!any(), "clearing an empty slot counts nothing");
    }
}
