//! A sink's bounded queue: exactly `capacity` snapshots, the oldest dropped when full — plus,
//! until the sink's start-up healthcheck has ended, the ticks that healthcheck may last (its
//! timeout over the interval): a sink whose server hangs at start-up would otherwise lose the
//! first seconds of data before it could export anything, though it buffers any later outage.
//!
//! tokio's broadcast channel would give drop-oldest for free, but it rounds its capacity up to a
//! power of two, so a configured queue of 3 would hold 4 and every loss count would be off by
//! one. This is the small, exact version.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::model::Snapshot;

#[derive(Debug)]
pub(crate) struct SinkQueue {
    state: Mutex<State>,
    ready: Notify,
    capacity: usize,
}

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Arc<Snapshot>>,
    closed: bool,
    /// An inline export asked for the sink's `flush` ([`InlineExport::FlushDue`](crate::InlineExport)).
    flush_due: bool,
    /// Snapshots held beyond `capacity` until [`SinkQueue::started`].
    startup_allowance: usize,
}

impl SinkQueue {
    #[cfg(test)]
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_startup_allowance(capacity, 0)
    }

    /// A queue that holds `allowance` more snapshots until [`SinkQueue::started`].
    pub(crate) fn with_startup_allowance(capacity: usize, allowance: usize) -> Self {
        // Grown as needed: a large capacity costs nothing until a sink falls behind.
        let items = VecDeque::with_capacity(capacity.min(32));
        Self {
            state: Mutex::new(State { items, closed: false, flush_due: false, startup_allowance: allowance }),
            ready: Notify::new(),
            capacity,
        }
    }

    /// The sink's start-up is over: from now on, `capacity` is the bound. What the allowance
    /// held stays queued; the next snapshots find the queue full only once it drained below it.
    pub(crate) fn started(&self) {
        self.lock().startup_allowance = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enqueues `snapshot`; returns `true` when a snapshot was lost: the queue was full and its
    /// oldest entry was dropped to make room, or it is closed (the sink has shut down) and
    /// `snapshot` itself is dropped. Never waits, and does not wake the consumer: the sampling
    /// thread enqueues into every sink's queue and wakes the runtime once, whose task then calls
    /// [`SinkQueue::wake`] for each (a wake from outside the runtime costs a system call; from
    /// inside, none).
    pub(crate) fn enqueue(&self, snapshot: Arc<Snapshot>) -> bool {
        let mut st = self.lock();
        if st.closed {
            return true;
        }
        let dropped = st.items.len() >= self.capacity + st.startup_allowance && st.items.pop_front().is_some();
        st.items.push_back(snapshot);
        dropped
    }

    /// Wakes the consumer to look at the queue.
    pub(crate) fn wake(&self) {
        self.ready.notify_one();
    }

    /// Whether nothing is queued (an inline export may go ahead of nothing).
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().items.is_empty()
    }

    /// Asks the consumer for a flush of the sink (it is woken with the other sinks' queues).
    pub(crate) fn request_flush(&self) {
        self.lock().flush_due = true;
    }

    /// Whether a flush was asked for since the last call.
    pub(crate) fn take_flush_due(&self) -> bool {
        std::mem::take(&mut self.lock().flush_due)
    }

    /// Waits until a snapshot is queued, a flush is due, or the queue is closed. Cancel-safe:
    /// takes nothing.
    pub(crate) async fn ready(&self) {
        loop {
            let notified = self.ready.notified();
            {
                let st = self.lock();
                // Not `closed`: only the worker closes its queue, as it finishes.
                if !st.items.is_empty() || st.flush_due {
                    return;
                }
            }
            notified.await;
        }
    }

    /// The oldest queued snapshot, if any, without waiting.
    pub(crate) fn try_pop(&self) -> Option<Arc<Snapshot>> {
        self.lock().items.pop_front()
    }

    /// Waits for the oldest snapshot; `None` once the queue is closed and empty. Cancel-safe:
    /// entries stay in the queue until returned. (The worker waits with [`SinkQueue::ready`] and
    /// pops under the sink's lock instead.)
    #[cfg(test)]
    pub(crate) async fn pop(&self) -> Option<Arc<Snapshot>> {
        loop {
            let notified = self.ready.notified();
            {
                let mut st = self.lock();
                if let Some(s) = st.items.pop_front() {
                    return Some(s);
                }
                if st.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Refuses further snapshots and wakes the consumer.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SystemInfo;

    fn push(q: &SinkQueue, snapshot: Arc<Snapshot>) -> bool {
        let dropped = q.enqueue(snapshot);
        q.wake();
        dropped
    }

    fn snap(seq: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::new(Arc::new(SystemInfo::default()), Vec::new()).with_seq(seq))
    }

    #[tokio::test]
    async fn holds_exactly_capacity_and_drops_the_oldest() {
        let q = SinkQueue::new(3);
        let dropped: Vec<bool> = (1..=5).map(|i| push(&q, snap(i))).collect();
        assert_eq!(dropped, [false, false, false, true, true]);
        let mut seqs = Vec::new();
        while let Some(s) = q.try_pop() {
            seqs.push(s.seq);
        }
        assert_eq!(seqs, [3, 4, 5]);
    }

    #[tokio::test]
    async fn the_startup_allowance_holds_more_until_started() {
        let q = SinkQueue::with_startup_allowance(2, 3);
        let dropped: Vec<bool> = (1..=6).map(|i| push(&q, snap(i))).collect();
        assert_eq!(dropped, [false, false, false, false, false, true], "2 + 3 held while starting");
        q.started();
        // Still 5 queued: the next push drops one (the queue is above its capacity) ...
        assert!(push(&q, snap(7)));
        for _ in 0..4 {
            q.try_pop();
        }
        // ... and once it drained below the capacity, nothing is dropped again until it is full.
        assert_eq!([push(&q, snap(8)), push(&q, snap(9))], [false, true]);
        let seqs: Vec<u64> = std::iter::from_fn(|| q.try_pop()).map(|s| s.seq).collect();
        assert_eq!(seqs, [8, 9]);
    }

    #[tokio::test]
    async fn pop_waits_for_a_push_and_ends_when_closed() {
        let q = Arc::new(SinkQueue::new(2));
        let consumer = {
            let q = q.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(s) = q.pop().await {
                    got.push(s.seq);
                }
                got
            })
        };
        tokio::task::yield_now().await;
        push(&q, snap(1));
        tokio::task::yield_now().await;
        push(&q, snap(2));
        q.close();
        assert!(push(&q, snap(3)), "a closed queue takes nothing, and says the snapshot is lost");
        assert_eq!(consumer.await.unwrap(), [1, 2]);
    }
}
