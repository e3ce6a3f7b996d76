//! What the calling thread is doing for engines (a worker, or inside hand-driven turns), so
//! a shutdown or a drop never waits for something that may be waiting for the caller.

use std::cell::{Cell, RefCell};

#[cfg(not(loom))]
std::thread_local! {
    static WORKER: Cell<bool> = const { Cell::new(false) };
    /// The hand-driven engines whose `turn` this thread is inside, innermost last.
    static TURNING: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}
#[cfg(loom)]
loom::thread_local! {
    static WORKER: Cell<bool> = Cell::new(false);
    static TURNING: RefCell<Vec<u32>> = RefCell::new(Vec::new());
}

/// Marks the calling thread as an engine's worker for the rest of its life.
#[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
pub(crate) fn become_worker() {
    let _ = WORKER.try_with(|worker| worker.set(true));
}

/// Whether the calling thread is a worker of any engine: it must wait for no worker.
pub(crate) fn is_worker() -> bool {
    WORKER.try_with(Cell::get).unwrap_or(false)
}

/// Whether the calling thread is inside a turn of any hand-driven engine: it must not wait for
/// another's turn.
pub(crate) fn in_any_turn() -> bool {
    TURNING
        .try_with(|turning| !turning.borrow().is_empty())
        .unwrap_or(false)
}

/// Why [`Turn::begin`] began no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoTurn {
    /// Already inside a turn of that engine.
    Inside,
    /// This thread's locals are being destroyed.
    Exiting,
}

/// The calling thread's turn of one engine; ends when dropped.
pub(crate) struct Turn(u32);

impl Turn {
    pub(crate) fn begin(engine: u32) -> Result<Self, NoTurn> {
        TURNING
            .try_with(|turning| {
                let mut turning = turning.borrow_mut();
                if turning.contains(&engine) {
                    return Err(NoTurn::Inside);
                }
                turning.push(engine);
                Ok(Self(engine))
            })
            .unwrap_or(Err(NoTurn::Exiting))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let _ = TURNING.try_with(|turning| {
            let mut turning = turning.borrow_mut();
            if let Some(at) = turning.iter().rposition(|&engine| engine == self.0) {
                turning.remove(at);
            }
        });
    }
}
