//! Fork detection. Data-loader workers fork the training process: the child inherits the
//! Monitor's memory but none of its threads, so it must neither use the runtime (its workers do
//! not exist there: waiting for them would hang) nor export anything. A `pthread_atfork` child
//! handler bumps a generation counter; every Monitor remembers the generation it was made in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

extern "C" fn in_child() {
    // Async-signal-safe: one atomic add, nothing else.
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Installs the fork handler (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: `in_child` is async-signal-safe and lives for the whole process.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            tracing::warn!(rc, "pthread_atfork failed; a forked child could hang on a Monitor");
        }
    });
}

/// The current fork generation: 0 in the process that imported gpumon, +1 per fork since.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}
