//! Each thread's view of each engine it uses: its home shard and its lanes, found through a
//! thread-local so that the hot path touches no shared structure to pick a shard.

use std::cell::{OnceCell, RefCell};
use std::rc::Rc;

use crate::engine_shared::EngineShared;
use crate::lane::Lane;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;

/// One thread's context for one engine.
pub(crate) struct Context {
    pub(crate) engine: Arc<EngineShared>,
    /// The shard this thread schedules onto: chosen once, round-robin across threads, or
    /// the worker's own shard for a worker thread.
    pub(crate) home: usize,
    lanes: Box<[OnceCell<Arc<Lane>>]>,
}

#[cfg(not(loom))]
std::thread_local! {
    static CONTEXTS: RefCell<Vec<Rc<Context>>> = const { RefCell::new(Vec::new()) };
}
#[cfg(loom)]
loom::thread_local! {
    static CONTEXTS: RefCell<Vec<Rc<Context>>> = RefCell::new(Vec::new());
}

impl Context {
    /// This thread's lane into `shard`, opened on first use.
    #[inline]
    pub(crate) fn lane(&self, shard: usize) -> &Lane {
        self.lanes[shard].get_or_init(|| self.engine.shards[shard].open_lane())
    }
}

/// The calling thread's context for `engine`, created on first use. `None` while the
/// thread's locals are being destroyed, or if this is reached re-entrantly while the
/// context list is being changed.
#[inline]
pub(crate) fn current(engine: &Arc<EngineShared>) -> Option<Rc<Context>> {
    current_with_home(engine, None)
}

/// Makes `home` the calling thread's home shard for `engine` (for worker threads).
#[cfg_attr(
    loom,
    allow(
        dead_code,
        reason = "loom models drive engines by hand, without worker threads"
    )
)]
pub(crate) fn set_home(engine: &Arc<EngineShared>, home: usize) {
    let _ = current_with_home(engine, Some(home));
}

fn current_with_home(engine: &Arc<EngineShared>, home: Option<usize>) -> Option<Rc<Context>> {
    CONTEXTS
        .try_with(|contexts| {
            if let Some(found) = contexts
                .try_borrow()
                .ok()?
                .iter()
                .find(|context| Arc::ptr_eq(&context.engine, engine))
            {
                return Some(Rc::clone(found));
            }
            let shards = engine.shards.len();
            let home = home.unwrap_or_else(|| {
                (engine.next_home.fetch_add(1, Ordering::Relaxed) % shards as u64) as usize
            });
            let context = Rc::new(Context {
                engine: Arc::clone(engine),
                home,
                lanes: (0..shards).map(|_| OnceCell::new()).collect(),
            });
            contexts.try_borrow_mut().ok()?.push(Rc::clone(&context));
            Some(context)
        })
        .ok()
        .flatten()
}

impl Drop for Context {
    /// The thread is exiting: everything on its lanes goes to the shards' inboxes, its
    /// magazines go back to the pools, and the workers may forget the lanes.
    fn drop(&mut self) {
        for (shard, lane) in self.lanes.iter_mut().enumerate() {
            if let Some(lane) = lane.take() {
                self.engine.close_lane(shard, &lane);
            }
        }
    }
}
