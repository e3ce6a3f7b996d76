//! Workloads that need pieces corewheel does not have yet: they say so instead of running.

pub fn burst_steal() {
    crate::progress::print("burst-steal: not yet: needs the engine's work stealing\n");
}
