//! Where a session hears the end of its waits in the gate's queue: one box made for the
//! session and used for each of its waits in turn, where a channel made for every wait
//! costs an allocation each time (and, with many clients waiting at once, the allocator's
//! slow path). A wait's [`Sender`] answers at most once; dropped unanswered, it says so, as a
//! channel's sender would. A sender of an earlier wait is turned away. Before its answer a
//! wait may hear a notice (its client is to be told it is queued), which does not end it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// One session's box for the answers to its waits, one wait at a time.
#[derive(Debug)]
pub struct Mailbox<T> {
    inner: Mutex<Inner<T>>,
}

#[derive(Debug)]
struct Inner<T> {
    /// The wait the box serves now.
    wait: u64,
    /// That wait's sender may still answer (it neither answered nor was dropped, and the
    /// waiter did not give up).
    open: bool,
    answer: Option<T>,
    /// A notice for the wait, not heard yet.
    notice: bool,
    waker: Option<Waker>,
}

/// The answering side of one wait.
#[derive(Debug)]
pub struct Sender<T> {
    /// `None` once it answered.
    mailbox: Option<Arc<Mailbox<T>>>,
    wait: u64,
}

/// What a wait hears next.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard<T> {
    /// Its answer: the wait is over.
    Answer(T),
    /// Its sender was dropped unanswered: the wait is over.
    Unanswered,
    /// A notice: the wait goes on.
    Notice,
}

/// Gives one wait a notice, once, without answering it (see [`Sender::notifier`]).
#[derive(Debug)]
pub struct Notifier<T> {
    mailbox: Arc<Mailbox<T>>,
    wait: u64,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox {
            inner: Mutex::new(Inner {
                wait: 0,
                open: false,
                answer: None,
                notice: false,
                waker: None,
            }),
        }
    }
}

impl<T> Mailbox<T> {
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // Nothing runs under this lock that can panic halfway: a poisoned box is still whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a wait: its sender. Whatever an earlier wait left is dropped (so no lock that
    /// dropping it may take is to be held here).
    pub fn sender(self: &Arc<Self>) -> Sender<T> {
        let (wait, left) = {
            let mut inner = self.lock();
            inner.wait = inner.wait.wrapping_add(1);
            inner.open = true;
            inner.notice = false;
            inner.waker = None;
            (inner.wait, inner.answer.take())
        };
        drop(left);
        Sender {
            mailbox: Some(Arc::clone(self)),
            wait,
        }
    }

    /// What the current wait hears next: a notice, or the end of the wait.
    #[cfg(test)]
    pub async fn listen(&self) -> Heard<T> {
        std::future::poll_fn(|cx| self.poll_heard(cx)).await
    }

    /// The waiter gives up: no sender of this wait may answer any more. An answer that came
    /// and was not taken is returned, to be dropped by the caller (outside any lock).
    pub fn close(&self) -> Option<T> {
        let mut inner = self.lock();
        inner.open = false;
        inner.wait = inner.wait.wrapping_add(1);
        inner.notice = false;
        inner.waker = None;
        inner.answer.take()
    }

    /// Ends the wait `wait` with what `answer` holds (nothing: the sender went unanswered),
    /// taking it; false, leaving it, when that wait is over.
    fn end(&self, wait: u64, answer: &mut Option<T>) -> bool {
        let waker = {
            let mut inner = self.lock();
            if inner.wait != wait || !inner.open {
                return false;
            }
            inner.open = false;
            // (An open box holds no answer: the one stored here replaces nothing.)
            inner.answer = answer.take();
            inner.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }
}

impl<T> Sender<T> {
    /// Answers the wait; gives `answer` back when the waiter gave up.
    pub fn send(mut self, answer: T) -> Result<(), T> {
        let Some(mailbox) = self.mailbox.take() else {
            return Err(answer);
        };
        let mut answer = Some(answer);
        match mailbox.end(self.wait, &mut answer) {
            true => Ok(()),
            false => answer.map_or(Ok(()), Err),
        }
    }

    /// What gives this sender's wait a notice (`None` once it answered).
    pub fn notifier(&self) -> Option<Notifier<T>> {
        self.mailbox.as_ref().map(|mailbox| Notifier {
            mailbox: Arc::clone(mailbox),
            wait: self.wait,
        })
    }

    /// The waiter no longer waits for this sender's answer.
    pub fn is_closed(&self) -> bool {
        self.mailbox.as_ref().is_none_or(|m| {
            let inner = m.lock();
            inner.wait != self.wait || !inner.open
        })
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(mailbox) = self.mailbox.take() {
            mailbox.end(self.wait, &mut None);
        }
    }
}

impl<T> Notifier<T> {
    /// Gives the wait its notice, unless it is over.
    pub fn notify(self) {
        let waker = {
            let mut inner = self.mailbox.lock();
            if inner.wait != self.wait || !inner.open {
                return;
            }
            inner.notice = true;
            inner.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Mailbox<T> {
    /// What the current wait has heard: its answer first, then the end of it, then a
    /// notice, taken; otherwise `cx` is woken when there is something.
    pub fn poll_heard(&self, cx: &mut Context<'_>) -> Poll<Heard<T>> {
        let mut inner = self.lock();
        if let Some(answer) = inner.answer.take() {
            return Poll::Ready(Heard::Answer(answer));
        }
        if !inner.open {
            return Poll::Ready(Heard::Unanswered);
        }
        if std::mem::take(&mut inner.notice) {
            return Poll::Ready(Heard::Notice);
        }
        match &mut inner.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed() -> Arc<Mailbox<String>> {
        Arc::new(Mailbox::default())
    }

    #[tokio::test]
    async fn an_answer_reaches_the_wait_it_was_sent_for() {
        let mailbox = boxed();
        let tx = mailbox.sender();
        assert!(!tx.is_closed());
        let waiting = tokio::spawn({
            let mailbox = Arc::clone(&mailbox);
            async move { mailbox.listen().await }
        });
        tokio::task::yield_now().await;
        tx.send("granted".into()).unwrap();
        assert_eq!(waiting.await.unwrap(), Heard::Answer("granted".to_string()));
        // The box serves the next wait the same way.
        let tx = mailbox.sender();
        tx.send("again".into()).unwrap();
        assert_eq!(mailbox.listen().await, Heard::Answer("again".to_string()));
    }

    #[tokio::test]
    async fn a_sender_dropped_unanswered_ends_the_wait_with_nothing() {
        let mailbox = boxed();
        let tx = mailbox.sender();
        drop(tx);
        assert_eq!(mailbox.listen().await, Heard::Unanswered);
    }

    #[test]
    fn a_waiter_that_gave_up_turns_its_answer_away() {
        let mailbox = boxed();
        let tx = mailbox.sender();
        assert_eq!(mailbox.close(), None);
        assert!(tx.is_closed());
        assert_eq!(tx.send("late".into()), Err("late".to_string()));
    }

    #[test]
    fn an_answer_that_came_before_the_waiter_gave_up_is_handed_back() {
        let mailbox = boxed();
        mailbox.sender().send("granted".into()).unwrap();
        assert_eq!(mailbox.close().as_deref(), Some("granted"));
        assert_eq!(mailbox.close(), None);
    }

    #[tokio::test]
    async fn a_sender_of_an_earlier_wait_cannot_answer_a_later_one() {
        let mailbox = boxed();
        let old = mailbox.sender();
        let _ = mailbox.close();
        let new = mailbox.sender();
        assert!(old.is_closed());
        assert_eq!(old.send("stale".into()), Err("stale".to_string()));
        assert!(!new.is_closed());
        // Nor does dropping one end the later wait.
        let older = {
            let _ = mailbox.close();
            mailbox.sender()
        };
        let newest = mailbox.sender();
        drop(older);
        assert!(!newest.is_closed());
        newest.send("fresh".into()).unwrap();
        assert_eq!(mailbox.listen().await, Heard::Answer("fresh".to_string()));
        drop(new);
    }

    #[tokio::test]
    async fn a_notice_is_heard_once_before_the_answer_and_does_not_end_the_wait() {
        let mailbox = boxed();
        let tx = mailbox.sender();
        let listening = tokio::spawn({
            let mailbox = Arc::clone(&mailbox);
            async move { mailbox.listen().await }
        });
        tokio::task::yield_now().await;
        tx.notifier().expect("unanswered").notify();
        assert_eq!(listening.await.unwrap(), Heard::Notice);
        assert!(!tx.is_closed(), "the wait goes on");
        // An answer that comes with a notice not heard yet goes first.
        tx.notifier().expect("unanswered").notify();
        tx.send("granted".into()).unwrap();
        assert_eq!(mailbox.listen().await, Heard::Answer("granted".to_string()));
        // The answer comes first, and the notice left behind dies with the wait.
        let tx = mailbox.sender();
        tx.notifier().expect("unanswered").notify();
        let notifier = tx.notifier().expect("unanswered");
        drop(tx);
        notifier.notify();
        assert_eq!(mailbox.listen().await, Heard::Unanswered);
    }

    /// Whether the current wait has heard nothing yet.
    fn hears_nothing(mailbox: &Mailbox<String>) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        mailbox.poll_heard(&mut cx).is_pending()
    }

    #[test]
    fn a_notice_for_an_earlier_wait_is_not_heard_by_a_later_one() {
        let mailbox = boxed();
        let old = mailbox.sender().notifier().expect("unanswered");
        let _ = mailbox.close();
        let tx = mailbox.sender();
        old.notify();
        assert!(hears_nothing(&mailbox), "an earlier wait's notice");
        // A notice left by a wait is dropped when it ends, whether given up or not.
        tx.notifier().expect("unanswered").notify();
        let _ = mailbox.close();
        let tx = mailbox.sender();
        assert!(hears_nothing(&mailbox), "the notice of a wait given up");
        tx.notifier().expect("unanswered").notify();
        let tx = mailbox.sender();
        assert!(hears_nothing(&mailbox), "the notice of the wait before");
        tx.notifier().expect("unanswered").notify();
        let mut cx = Context::from_waker(Waker::noop());
        let heard = mailbox.poll_heard(&mut cx);
        assert_eq!(heard, Poll::Ready(Heard::Notice));
        assert!(hears_nothing(&mailbox), "a notice is heard once");
        drop(tx);
    }

    #[test]
    fn a_sender_answers_once() {
        let mailbox = boxed();
        let tx = mailbox.sender();
        tx.send("one".into()).unwrap();
        // The wait is over: a sender for it would be turned away.
        assert_eq!(mailbox.close().as_deref(), Some("one"));
    }
}
