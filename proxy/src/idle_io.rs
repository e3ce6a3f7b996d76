//! The per-connection idle timeout: a stream wrapper that notes when bytes last moved,
//! and a watch beside hyper's connection future that ends the connection once none have
//! for the idle time.
//!
//! The watch runs in the connection's own task (a `select!` with hyper's future), not in
//! the stream: hyper does not always poll the stream while a response is in progress (with
//! unread client bytes buffered, such as a pipelined request or a stray CRLF, it waits on
//! the upstream alone), so a timer polled only from the stream's `Pending` could be left
//! unpolled for as long as the upstream stalls, and the connection, with its upstream
//! socket, held for ever. Ending the connection future drops the socket and the request
//! in flight, and with it the upstream connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::stats::Stats;
use crate::timer::ProxyTimer;

/// When bytes last moved on one connection, shared by its stream and its watch: nanoseconds
/// after the connection's start, on the timer's clock.
pub struct Activity {
    start: Instant,
    last: AtomicU64,
}

impl Activity {
    /// Activity counted from `start` (the connection's first moment).
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            last: AtomicU64::new(0),
        }
    }

    /// Bytes moved at `now`.
    fn touch(&self, now: Instant) {
        let since =
            u64::try_from(now.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(since, Ordering::Relaxed);
    }

    /// When bytes last moved.
    fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }
}

/// A stream that notes in its [`Activity`] every read and write that moves bytes.
pub struct IdleIo<S, T: ProxyTimer> {
    stream: S,
    timer: T,
    activity: Arc<Activity>,
}

impl<S, T: ProxyTimer> IdleIo<S, T> {
    /// Wraps `stream`, noting its activity in `activity`.
    pub fn new(stream: S, timer: T, activity: Arc<Activity>) -> Self {
        Self {
            stream,
            timer,
            activity,
        }
    }

    fn touch(&self) {
        self.activity.touch(self.timer.now());
    }
}

/// Waits until the connection has moved no byte for `idle`, by `activity`, then records
/// how late it noticed in `stats.idle_timeouts` and returns: the caller ends the
/// connection. Never before `idle` has passed since the last byte, as the sleep is armed
/// for exactly that and looked at again whenever it ends.
pub async fn idle_watch<T: ProxyTimer>(
    timer: T,
    activity: Arc<Activity>,
    idle: Duration,
    stats: Arc<Stats>,
) {
    let mut deadline = activity.last() + idle;
    let mut sleep = timer.sleep_until(deadline);
    loop {
        (&mut sleep).await;
        let due = activity.last() + idle;
        if due > deadline {
            // Bytes moved since the sleep was armed: wait for the new deadline.
            deadline = due;
            timer.reset(&mut sleep, deadline);
            continue;
        }
        stats.idle_timeouts.record(deadline, timer.now());
        return;
    }
}

impl<S: AsyncRead + Unpin, T: ProxyTimer> AsyncRead for IdleIo<S, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin, T: ProxyTimer> IdleIo<S, T> {
    /// A write's outcome: `n > 0` bytes written is activity.
    fn after_write(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin, T: ProxyTimer> AsyncWrite for IdleIo<S, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.after_write(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.after_write(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
