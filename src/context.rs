//! Each thread's view of each engine it uses: its home shard and its lanes, found through a
//! thread-local so that the hot path touches no shared structure to pick a shard.

use std::cell::{Cell, OnceCell, RefCell};

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

/// The last context used: (engine, context). Cleared when any context is dropped.
type Last = Cell<(*const EngineShared, *const Context)>;

/// This thread's contexts, each allocated once and held as the raw pointer `Box::into_raw`
/// gave, so that the pointers handed out stay valid while the list grows (a `Box` moved by
/// the list's growth would assert unique access and invalidate them). Freed when the
/// thread's locals are destroyed.
struct Contexts(Vec<*mut Context>);

impl Drop for Contexts {
    fn drop(&mut self) {
        for context in self.0.drain(..) {
            // SAFETY: every pointer came from `Box::into_raw` in `lookup` and is freed once,
            // here; pointers cached in LAST are cleared by the context's own drop.
            drop(unsafe { Box::from_raw(context) });
        }
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static CONTEXTS: RefCell<Contexts> = const { RefCell::new(Contexts(Vec::new())) };
    static LAST: Last = const { Cell::new((std::ptr::null(), std::ptr::null())) };
}
#[cfg(loom)]
loom::thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts(Vec::new()));
    static LAST: Last = Cell::new((std::ptr::null(), std::ptr::null()));
}

impl Context {
    fn new(engine: &Arc<EngineShared>, home: Option<usize>) -> Self {
        let shards = engine.shards.len();
        let home = home.unwrap_or_else(|| {
            (engine.next_home.fetch_add(1, Ordering::Relaxed) % shards as u64) as usize
        });
        Self {
            engine: Arc::clone(engine),
            home,
            lanes: (0..shards).map(|_| OnceCell::new()).collect(),
        }
    }

    /// This thread's lane into `shard`, opened on first use.
    #[inline]
    pub(crate) fn lane(&self, shard: usize) -> &Lane {
        self.lanes[shard].get_or_init(|| self.engine.shards[shard].open_lane())
    }
}

/// Runs `f` with the calling thread's context for `engine`, created on first use. `f` gets
/// `None` while the thread's locals are being destroyed, or when a context cannot be added
/// because the list is borrowed (a re-entrant call from inside a context's creation).
#[inline]
pub(crate) fn with<R>(engine: &Arc<EngineShared>, f: impl FnOnce(Option<&Context>) -> R) -> R {
    let wanted = Arc::as_ptr(engine);
    let cached = LAST.try_with(Cell::get).ok();
    let context = match cached {
        Some((last_engine, context)) if last_engine == wanted && !context.is_null() => {
            Some(context)
        }
        _ => lookup(engine, None),
    };
    // SAFETY: `context` is a context owned by this thread's CONTEXTS, which frees contexts
    // only when the thread's locals are destroyed; dropping a context clears LAST,
    // and `lookup` returns `None` once CONTEXTS is gone. The context's `Arc` keeps `engine`
    // alive, so its address cannot be reused by another engine while this pointer is cached.
    f(context.map(|context| unsafe { &*context }))
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
    let _ = lookup(engine, Some(home));
}

#[cold]
fn lookup(engine: &Arc<EngineShared>, home: Option<usize>) -> Option<*const Context> {
    let found = CONTEXTS
        .try_with(|contexts| {
            if let Some(&found) = contexts.try_borrow().ok()?.0.iter().find(|&&context| {
                // SAFETY: pointers in the list are live until the list is dropped.
                Arc::ptr_eq(unsafe { &(*context).engine }, engine)
            }) {
                return Some(found.cast_const());
            }
            let mut list = contexts.try_borrow_mut().ok()?;
            let context = Box::into_raw(Box::new(Context::new(engine, home)));
            list.0.push(context);
            Some(context.cast_const())
        })
        .ok()
        .flatten()?;
    let _ = LAST.try_with(|last| last.set((Arc::as_ptr(engine), found)));
    Some(found)
}

impl Drop for Context {
    /// The thread is exiting: everything on its lanes goes to the shards' inboxes, its
    /// magazines go back to the pools, and the workers may forget the lanes.
    fn drop(&mut self) {
        let _ = LAST.try_with(|last| last.set((std::ptr::null(), std::ptr::null())));
        for (shard, lane) in self.lanes.iter_mut().enumerate() {
            if let Some(lane) = lane.take() {
                self.engine.close_lane(shard, &lane);
            }
        }
    }
}
