//! The per-connection idle timeout: a stream wrapper whose sleep moves on every read and
//! write, and which fails the connection's I/O once the sleep ends.
//!
//! Living inside the stream (rather than in a `select!` beside hyper's connection future)
//! lets every byte moved reset the deadline without any state shared between tasks, and
//! the timeout reaches hyper as an ordinary I/O error, after which hyper drops (and so
//! closes) the socket. hyper polls the stream for reading whenever it waits on the client,
//! between requests and while a request is upstream, and for writing while the client does
//! not read; each `Pending` polls the sleep too, so a stalled client is noticed in every
//! one of those states.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::stats::Stats;
use crate::timer::ProxyTimer;

/// A stream that fails with [`io::ErrorKind::TimedOut`] after `idle` with no byte moved.
pub struct IdleIo<S, T: ProxyTimer> {
    stream: S,
    timer: T,
    idle: Duration,
    sleep: T::Sleep,
    /// Where `sleep` ends, for the lateness `stats` records when it does.
    deadline: Instant,
    stats: Arc<Stats>,
}

impl<S, T: ProxyTimer> IdleIo<S, T> {
    /// Wraps `stream`; the first deadline is `idle` from now. A timeout is recorded in
    /// `stats.idle_timeouts`.
    pub fn new(stream: S, timer: T, idle: Duration, stats: Arc<Stats>) -> Self {
        let deadline = timer.now() + idle;
        let sleep = timer.sleep_until(deadline);
        Self {
            stream,
            timer,
            idle,
            sleep,
            deadline,
            stats,
        }
    }

    /// Bytes moved: the deadline moves to `idle` from now. The next `Pending` polls the
    /// sleep, which is what arms it at its new deadline.
    fn touch(&mut self) {
        self.deadline = self.timer.now() + self.idle;
        self.timer.reset(&mut self.sleep, self.deadline);
    }

    /// The stream is not ready: the connection is still idle, or its time is up.
    fn poll_idle<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Ready(()) => {
                let now = self.timer.now();
                self.stats.idle_timeouts.record(self.deadline, now);
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// A write's outcome: `n > 0` bytes written resets the deadline, `Pending` checks it.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.touch();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => self.poll_idle(cx),
            failed => failed,
        }
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
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.touch();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => this.poll_idle(cx),
            failed => failed,
        }
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
        this.after_write(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.after_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Pending => this.poll_idle(cx),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
