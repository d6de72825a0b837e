//! The worker threads: with `worker_threads` above 1, each thread runs a runtime of its own
//! (a current-thread tokio runtime), and each client connection is served on one of them for
//! its whole life, so a session's wakes never cross threads and no task is stolen. One
//! process, one gate, one set of pools: only the sockets are each thread's own.
//!
//! A server's socket is registered with the reactor of the thread that opened it, or of the
//! last session that moved it. A session that checks out a server living on another thread
//! moves the socket to its own
//! (see [`crate::net::Stream::rehome`]); a pool hands out an idle server of the asking thread
//! first, so that move is rare.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use std::thread::ThreadId;

use tokio::runtime::Handle;

/// The worker threads' runtimes, and how many clients each serves.
#[derive(Debug)]
pub struct Workers {
    /// Thread `i`'s runtime (0: the thread that runs the daemon's own tasks).
    handles: Vec<Handle>,
    /// Thread `i` itself.
    threads: Vec<ThreadId>,
    /// Clients served on each thread.
    clients: Vec<AtomicUsize>,
    /// Where the search for the least busy thread starts next (ties go round).
    next: AtomicUsize,
    /// Server sockets moved from one thread's reactor to another's.
    moves: AtomicU64,
}

/// A worker thread's index.
pub type WorkerId = usize;

impl Workers {
    /// Each thread's runtime and the thread; the first is the daemon's own, the others run
    /// on threads of their own.
    pub fn new(threads: Vec<(Handle, ThreadId)>) -> Self {
        let clients = threads.iter().map(|_| AtomicUsize::new(0)).collect();
        let (handles, threads) = threads.into_iter().unzip();
        Workers {
            handles,
            threads,
            clients,
            next: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
        }
    }

    /// No threads of its own: everything runs on the caller's runtime.
    pub fn single() -> Self {
        Workers {
            handles: Vec::new(),
            threads: Vec::new(),
            clients: Vec::new(),
            next: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
        }
    }

    /// The worker thread this runs on, when there are several (a socket opened here is served
    /// by its reactor).
    pub fn current(&self) -> Option<WorkerId> {
        if !self.several() {
            return None;
        }
        let me = std::thread::current().id();
        self.threads.iter().position(|t| *t == me)
    }

    /// How many threads serve clients (1 when everything runs on the caller's runtime).
    pub fn count(&self) -> usize {
        self.handles.len().max(1)
    }

    /// Whether there is more than one thread (a socket may then have to move).
    pub fn several(&self) -> bool {
        self.handles.len() > 1
    }

    /// The thread serving the fewest clients (the next in turn among equals), counted as
    /// serving one more until the seat is dropped.
    pub fn seat(self: &Arc<Self>) -> Seat {
        let n = self.clients.len();
        let id = match n {
            0 | 1 => 0,
            _ => {
                let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
                (0..n)
                    .map(|k| (start + k) % n)
                    .min_by_key(|&i| self.clients[i].load(Ordering::Relaxed))
                    .unwrap_or(0)
            }
        };
        if let Some(c) = self.clients.get(id) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Seat {
            workers: Arc::clone(self),
            id,
        }
    }

    /// Runs `task` on thread `id` (on the caller's runtime when there is one thread).
    pub fn spawn<F>(&self, id: WorkerId, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match self.handles.get(id) {
            Some(handle) => drop(handle.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    /// A server's socket moved to another thread's reactor.
    pub fn note_move(&self) {
        self.moves.fetch_add(1, Ordering::Relaxed);
    }

    /// Server sockets moved between threads so far.
    pub fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }

    /// Clients served on each thread (empty with one thread).
    pub fn clients(&self) -> Vec<usize> {
        if !self.several() {
            return Vec::new();
        }
        self.clients
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

impl Default for Workers {
    fn default() -> Self {
        Workers::single()
    }
}

/// A client's place on a worker thread, given up when dropped.
#[derive(Debug)]
pub struct Seat {
    workers: Arc<Workers>,
    id: WorkerId,
}

impl Seat {
    /// The thread.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Where a server this client checks out must live: its thread, when there are several.
    pub fn home(&self) -> Option<WorkerId> {
        self.workers.several().then_some(self.id)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(c) = self.workers.clients.get(self.id) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtimes(n: usize) -> (Vec<tokio::runtime::Runtime>, Arc<Workers>) {
        let rts: Vec<_> = (0..n)
            .map(|_| {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
            })
            .collect();
        let me = std::thread::current().id();
        let workers = Arc::new(Workers::new(
            rts.iter().map(|r| (r.handle().clone(), me)).collect(),
        ));
        (rts, workers)
    }

    #[test]
    fn clients_go_to_the_least_busy_thread_and_leave_it_when_done() {
        let (_rts, workers) = runtimes(3);
        let a = workers.seat();
        let b = workers.seat();
        let c = workers.seat();
        let mut ids = [a.id(), b.id(), c.id()];
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 2]);
        let freed = b.id();
        drop(b);
        let d = workers.seat();
        assert_eq!(d.id(), freed);
        assert_eq!(workers.clients(), [1, 1, 1]);
        drop(d);
        assert_eq!(workers.clients().iter().sum::<usize>(), 2);
        assert!(Workers::single().clients().is_empty());
        assert_eq!(a.home(), Some(a.id()));
        // (Every runtime here was made on this thread: the first is this thread's.)
        assert_eq!(workers.current(), Some(0));
    }

    #[test]
    fn one_thread_has_no_home_to_keep() {
        let workers = Arc::new(Workers::single());
        let seat = workers.seat();
        assert_eq!(seat.id(), 0);
        assert_eq!(seat.home(), None);
        assert_eq!(workers.current(), None);
        let (_rts, one) = runtimes(1);
        assert_eq!(one.seat().home(), None);
        assert_eq!(one.current(), None);
    }
}
