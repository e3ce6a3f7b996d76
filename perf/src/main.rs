//! corewheel-perf: the million-timer workload harness. Runs each workload against corewheel and real peer crates in
//! one process run, prints a table per workload, and writes the run's CSV, plots and summary into a folder of its own
//! (see `results`). Every workload's plan is made first, so that the progress display knows the total.

mod cli;
mod named;
mod peers;
mod plots;
mod report;
mod results;
mod runner;
mod sys;
mod workloads;

use std::process::ExitCode;

use cli::Options;
use report::thousands;
use workloads::{Out, proxy};

/// Allocation is part of every timer's cost, so the results name the allocator; mimalloc is what the services
/// corewheel is for commonly run with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    if let Ok(args) = std::env::var(proxy::ENV) {
        return proxy::serve(&args);
    }
    if let Ok(spec) = std::env::var(workloads::live::ENV) {
        return workloads::live::child_main(&spec);
    }
    let options = Options::from_args();
    let run_dir = match results::create() {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("corewheel-perf: could not make a folder for the results: {error}");
            return ExitCode::FAILURE;
        }
    };
    let began = std::time::Instant::now();
    runner::print(&header(&options, &run_dir));
    let plans: Vec<_> = options.workloads.iter().map(|w| w.plan(&options)).collect();
    runner::start(plans.iter().map(|plan| plan.steps()).sum());
    let mut out = Out::default();
    for plan in &plans {
        let name = plan.workload.name();
        if plan.cells.is_empty() {
            runner::print(&format!(
                "{name}: skipped: none of the chosen peers and thread counts is one it runs\n"
            ));
            continue;
        }
        runner::workload(&format!("started  workload {name}"));
        let meter = sys::LoadMeter::start();
        plan.workload.run(plan, &options, &mut out);
        if let Some(share) = meter.others_share().map(|share| share * 100.0) {
            let shared = ": the machine was shared, so these figures are slower and noisier than on a quiet one";
            let warning = if share > 10.0 { shared } else { "" };
            runner::print(&format!(
                "{name}: (other processes used {share:.0}% of the CPUs while this workload ran{warning})\n"
            ));
            let metric = [("other_processes_cpu_share", share, "%")];
            out.csv.push_metrics(name, "machine", (0, 0), &metric);
        }
        runner::workload(&format!("finished workload {name}"));
    }
    runner::finish();
    match results::write(&out, &run_dir, options.save.as_deref(), began.elapsed()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corewheel-perf: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The run's header: what it runs, on what, and where its results go.
fn header(options: &Options, run_dir: &std::path::Path) -> String {
    let list = |items: Vec<u64>| items.into_iter().map(thousands).collect::<Vec<_>>();
    let threads = list(options.threads.iter().map(|&t| u64::from(t)).collect()).join(", ");
    let windows = list(options.windows.iter().map(|&w| u64::from(w)).collect()).join(", ");
    let (machine, results) = (plots::machine(), run_dir.display());
    let mut out = format!(
        "corewheel-perf: the million-timer workload harness\nmachine:   {machine}\nallocator: mimalloc\nresults:   {results}\n"
    );
    if cfg!(debug_assertions) {
        out.push_str("WARNING:   debug build: the numbers mean nothing; use cargo run --release\n");
    }
    let sizes = if options.full { "full" } else { "default" };
    out.push_str(&format!(
        "sizes:     {sizes} (--full for the full sizes, --timers N for the million-timer workloads)\n\
         threads:   {threads} (the multi-thread workloads; steady-mix and light-load run on the largest)\n\
         windows:   {windows} requests in flight per thread (engine-arm-cancel)\nsubjects:\n"
    ));
    let named = |name: &str, describe: &str| format!("  {name:<19}{describe}\n");
    let (peers, workloads) = (options.peers.iter(), options.workloads.iter());
    out.extend(peers.map(|s| named(s.name(), s.describe())));
    out.push_str("workloads:\n");
    out.extend(workloads.map(|w| named(w.name(), w.describe())));
    out
}
