//! Connections and script calls.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Client, Connection, ErrorKind, RedisResult, Value};

use crate::error::Error;

/// How long connecting, reading a reply or writing a command may take before the call
/// fails with [`Error::Redis`]: a server that hangs must not hang the handler threads.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A pooled connection idle this long is checked with a `PING` before a request that
/// must not be sent twice: a server restarted meanwhile has closed it, and such a request
/// cannot be sent again on a new connection once one fails (see [`Resend`]). Busy
/// connections are reused sooner and skip the check.
const CHECK_IDLE_AFTER: Duration = Duration::from_millis(100);

/// Whether a request may be sent again, on a new connection, when its pooled one turns
/// out closed. A connection that drops after the request left may have carried it: the
/// server may have run it and the reply been lost.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Running it twice is running it once (a renewal, a cancel, a heartbeat, a read).
    Safe,
    /// A second run would differ: a schedule could bring back a task acked in between,
    /// a claim or sweep would lose what the first claimed, an ack, failure or requeue
    /// would report the first one's effect as an error.
    Never,
}

/// A script, with the SHA1 the server knows it by once loaded.
pub(crate) struct Script {
    source: &'static str,
    sha: Mutex<Option<String>>,
    resend: Resend,
}

impl Script {
    pub(crate) const fn new(source: &'static str, resend: Resend) -> Self {
        Self {
            source,
            sha: Mutex::new(None),
            resend,
        }
    }
}

/// Idle connections, reused so that a call costs one round trip and no connect.
pub(crate) struct Pool {
    client: Client,
    /// Each with the instant it was put back.
    idle: Mutex<Vec<(Connection, Instant)>>,
    /// Requests sent: each command, script call or pipeline counts one.
    round_trips: AtomicU64,
}

impl Pool {
    pub(crate) fn new(url: &str) -> Result<Self, Error> {
        Ok(Self {
            client: Client::open(url)?,
            idle: Mutex::new(Vec::new()),
            round_trips: AtomicU64::new(0),
        })
    }

    /// Requests sent so far: each command, script call or pipeline counts one.
    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Counts `n` requests sent outside [`Pool::with`]'s single one.
    pub(crate) fn count(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
    }

    /// A new connection of its own, outside the pool (for a subscription). Reads time
    /// out too, so that a server that stops answering (before the caller sets its own
    /// timeout) cannot hang the subscribe, and with it close.
    pub(crate) fn connect(&self) -> Result<Connection, Error> {
        self.count(1);
        self.fresh()
    }

    /// A new connection with the I/O timeouts set.
    fn fresh(&self) -> Result<Connection, Error> {
        let conn = self.client.get_connection_with_timeout(IO_TIMEOUT)?;
        conn.set_read_timeout(Some(IO_TIMEOUT))?;
        conn.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(conn)
    }

    /// Runs `f`, which is [`Resend::Safe`], on a pooled connection.
    pub(crate) fn with<T>(
        &self,
        f: impl Fn(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, Error> {
        self.call(Resend::Safe, f)
    }

    /// Runs `f` on a pooled connection. A connection that saw an error is dropped rather
    /// than pooled: after a timeout its replies could be out of step with its commands.
    /// A pooled connection the server closed while it sat idle (a restarted server) is
    /// replaced: found by a `PING` first when `f` must not be sent twice and the
    /// connection sat idle for a while, else by `f` failing, which then runs once more on
    /// a new connection.
    fn call<T>(
        &self,
        resend: Resend,
        f: impl Fn(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, Error> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let was_pooled = pooled.is_some();
        let mut conn = match pooled {
            Some((mut conn, since))
                if resend == Resend::Never && since.elapsed() >= CHECK_IDLE_AFTER =>
            {
                self.count(1);
                match redis::cmd("PING").query::<()>(&mut conn) {
                    Ok(()) => conn,
                    Err(e) if e.is_connection_dropped() => self.fresh()?,
                    Err(e) => return Err(e.into()),
                }
            }
            Some((conn, _)) => conn,
            None => self.fresh()?,
        };
        self.count(1);
        let result = match f(&mut conn) {
            Err(e) if resend == Resend::Safe && was_pooled && e.is_connection_dropped() => {
                conn = self.fresh()?;
                self.count(1);
                f(&mut conn)?
            }
            other => other?,
        };
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((conn, Instant::now()));
        Ok(result)
    }

    /// Runs `script` by its SHA1, loading it first if this process has not, or if the
    /// server lost it (a restart empties the script cache).
    pub(crate) fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value, Error> {
        self.call(script.resend, |conn| {
            for _ in 0..2 {
                let sha = script.sha.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let sha = match sha {
                    Some(sha) => sha,
                    None => {
                        self.count(1);
                        let sha: String = redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(script.source)
                            .query(conn)?;
                        *script.sha.lock().unwrap_or_else(|p| p.into_inner()) = Some(sha.clone());
                        sha
                    }
                };
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&sha).arg(keys.len()).arg(keys);
                for arg in args {
                    cmd.arg(*arg);
                }
                match cmd.query::<Value>(conn) {
                    Err(e) if e.kind() == ErrorKind::NoScriptError => {
                        self.count(1);
                        *script.sha.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    }
                    other => return other,
                }
            }
            // Loaded just now and gone again: run it by its source.
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(script.source).arg(keys.len()).arg(keys);
            for arg in args {
                cmd.arg(*arg);
            }
            cmd.query(conn)
        })
    }
}

/// An integer reply.
pub(crate) fn int(v: &Value) -> Result<i64, Error> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(unexpected(other)),
    }
}

/// A string reply, as bytes.
pub(crate) fn bytes(v: &Value) -> Result<&[u8], Error> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        other => Err(unexpected(other)),
    }
}

/// An array reply.
pub(crate) fn array(v: &Value) -> Result<&[Value], Error> {
    match v {
        Value::Array(a) => Ok(a),
        other => Err(unexpected(other)),
    }
}

/// A reply of a shape no script returns: another program wrote to the queue's keys.
pub(crate) fn unexpected(v: &Value) -> Error {
    Error::BadFormat(format!("unexpected reply from a queue script: {v:?}"))
}
