//! Threads that serve HTTP connections, each driving its own single-threaded tokio runtime.
//!
//! An accepted connection is handed to one of them (round-robin) and stays there: its
//! requests are parsed, handled and answered on that thread, and its socket's readiness is
//! polled by that thread's own reactor. On the work-stealing runtime, a connection woken by
//! the shared reactor is often run by the other worker, with a futex wake-up per hand-off;
//! pinned to one thread as nginx's workers are, pinned 4 KiB reads went from 77–83k/s to
//! 83–101k/s and new-pin activations from 17.2k/s to 18.7–20.1k/s on a 2-core machine
//! (docs/BENCHMARKS.md, tenth session). Everything else (background upkeep, the registry's
//! own threads) stays on the main runtime; handlers' `spawn_blocking` uses the connection
//! thread's blocking pool.
//!
//! A handler that blocks its thread would stall that thread's other connections; none does
//! (blocking work goes through `spawn_blocking`), as on the main runtime, where it would stall
//! a worker.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The running connection threads; dropping this stops them (their connections have been
/// drained by then).
pub(crate) struct ConnectionThreads {
    handles: Vec<Handle>,
    next: AtomicUsize,
    _stops: Vec<oneshot::Sender<()>>,
}

impl ConnectionThreads {
    /// Starts `n` threads (at least one).
    pub(crate) fn start(n: usize) -> std::io::Result<Self> {
        let mut handles = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            std::thread::Builder::new()
                .name(format!("skillbox-conn-{i}"))
                .spawn(move || {
                    // `block_on` is what drives this runtime's reactor and timers, so it runs
                    // for as long as the server serves.
                    rt.block_on(async move {
                        let _ = stopped.await;
                    });
                    // Whatever is left was cut off by the bounded drain; a blocking task still
                    // running is not waited for.
                    rt.shutdown_background();
                })?;
        }
        Ok(ConnectionThreads {
            handles,
            next: AtomicUsize::new(0),
            _stops: stops,
        })
    }

    /// The runtime of the thread that takes the next connection.
    pub(crate) fn next(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.handles[i % self.handles.len()]
    }
}
