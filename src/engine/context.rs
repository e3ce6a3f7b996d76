//! Each thread's view of each engine it uses: its home shard and its lanes, found through a
//! thread-local. A context does not keep its engine alive, and is found by the engine's id, never
//! its address.

use std::cell::{Cell, OnceCell, RefCell};
use std::num::NonZeroU32;

use crate::engine::lane::Lane;
use crate::engine::shared::EngineShared;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use crate::time::cycle_clock::Anchor;

/// Weak, so dropping the engine frees it (loom's `Arc` has no weak form).
#[cfg(not(loom))]
type EngineRef = std::sync::Weak<EngineShared>;
#[cfg(loom)]
type EngineRef = Arc<EngineShared>;

/// One thread's context for one engine.
pub(crate) struct Context {
    engine_id: NonZeroU32,
    engine: EngineRef,
    /// The shard this thread schedules onto: round-robin, or a worker's own.
    pub(crate) home: usize,
    lanes: Box<[OnceCell<Arc<Lane>>]>,
    /// Where this thread's deadlines start from between clock reads.
    pub(crate) anchor: Anchor,
}

/// The last context used: (engine id, context). Cleared when any context is dropped.
type Last = Cell<(u32, *const Context)>;

/// This thread's contexts, as pointers from `Box::into_raw` (moving a `Box` would assert unique
/// access).
struct Contexts(Vec<*mut Context>);

impl Drop for Contexts {
    fn drop(&mut self) {
        for context in self.0.drain(..) {
            // SAFETY: from `Box::into_raw` in `lookup`, freed once; its drop clears LAST.
            drop(unsafe { Box::from_raw(context) });
        }
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static CONTEXTS: RefCell<Contexts> = const { RefCell::new(Contexts(Vec::new())) };
    static LAST: Last = const { Cell::new((0, std::ptr::null())) };
}
#[cfg(loom)]
loom::thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts(Vec::new()));
    static LAST: Last = Cell::new((0, std::ptr::null()));
}

impl Context {
    fn new(engine: &Arc<EngineShared>, home: Option<usize>) -> Self {
        let shards = engine.shards.len();
        let home = home.unwrap_or_else(|| {
            (engine.next_home.fetch_add(1, Ordering::Relaxed) % shards as u64) as usize
        });
        Self {
            engine_id: engine.id,
            #[cfg(not(loom))]
            engine: Arc::downgrade(engine),
            #[cfg(loom)]
            engine: Arc::clone(engine),
            home,
            lanes: (0..shards).map(|_| OnceCell::new()).collect(),
            anchor: Anchor::default(),
        }
    }

    /// This thread's lane into `shard` of this context's `engine`, opened on first use.
    #[inline]
    pub(crate) fn lane(&self, engine: &EngineShared, shard: usize) -> &Lane {
        match self.lanes[shard].get() {
            Some(lane) => lane,
            None => self.open_lane(engine, shard),
        }
    }

    #[cold]
    fn open_lane(&self, engine: &EngineShared, shard: usize) -> &Lane {
        self.lanes[shard].get_or_init(|| engine.shards[shard].open_lane())
    }

    fn engine(&self) -> Option<Arc<EngineShared>> {
        #[cfg(not(loom))]
        return self.engine.upgrade();
        #[cfg(loom)]
        return Some(Arc::clone(&self.engine));
    }
}

/// Runs `f` with the calling thread's context for `engine`, created on first use; `None` while the
/// thread's locals are destroyed, or re-entrantly during a creation.
#[inline]
pub(crate) fn with<R>(engine: &Arc<EngineShared>, f: impl FnOnce(Option<&Context>) -> R) -> R {
    let wanted = engine.id.get();
    let context = match LAST.try_with(Cell::get) {
        Ok((last_engine, context)) if last_engine == wanted && !context.is_null() => Some(context),
        _ => lookup(engine, None),
    };
    let context = context.map(|context| {
        // SAFETY: a context is freed only when its engine is dead or at thread exit, and its drop
        // clears LAST; a live engine's id is never reused.
        unsafe { &*context }
    });
    f(context)
}

/// Makes `home` the calling thread's home shard for `engine` (for worker threads).
#[cfg_attr(loom, allow(dead_code, reason = "loom models drive engines by hand"))]
pub(crate) fn set_home(engine: &Arc<EngineShared>, home: usize) {
    let _ = lookup(engine, Some(home));
}

#[cold]
fn lookup(engine: &Arc<EngineShared>, home: Option<usize>) -> Option<*const Context> {
    let found = CONTEXTS
        .try_with(|contexts| {
            let mut list = contexts.try_borrow_mut().ok()?;
            list.0.retain(|&context| {
                // SAFETY: pointers in the list are live until removed here or dropped.
                let alive = unsafe { (*context).engine() }.is_some();
                if !alive {
                    // SAFETY: from `Box::into_raw`, removed from the list, freed once.
                    drop(unsafe { Box::from_raw(context) });
                }
                alive
            });
            if let Some(&found) = list.0.iter().find(|&&context| {
                // SAFETY: as above.
                (unsafe { (*context).engine_id }) == engine.id
            }) {
                return Some(found.cast_const());
            }
            let context = Box::into_raw(Box::new(Context::new(engine, home)));
            list.0.push(context);
            Some(context.cast_const())
        })
        .ok()
        .flatten()?;
    let _ = LAST.try_with(|last| last.set((engine.id.get(), found)));
    Some(found)
}

impl Drop for Context {
    /// The thread is exiting: closes its lanes of a live engine.
    fn drop(&mut self) {
        let _ = LAST.try_with(|last| last.set((0, std::ptr::null())));
        let Some(engine) = self.engine() else {
            return;
        };
        for (shard, lane) in self.lanes.iter_mut().enumerate() {
            if let Some(lane) = lane.take() {
                engine.close_lane(shard, &lane);
            }
        }
    }
}
