//! Workloads that need pieces corewheel does not have yet: they say so instead of running.

pub fn burst_steal() {
    println!("burst-steal: not yet: needs the engine's work stealing\n");
}

pub fn steady_mix() {
    println!(
        "steady-mix: not yet: a mixed load of arms, resets and fires on the engine is still to be written\n"
    );
}
