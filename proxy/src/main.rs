//! The `corewheel-proxy` command: see `corewheel_proxy::USAGE`.

use std::process::ExitCode;

use corewheel_proxy::{Command, Config, USAGE, run_blocking};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let config = match Config::parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(config)) => config,
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("corewheel-proxy: {message}\nTry --help for the options.");
            return ExitCode::from(2);
        }
    };
    let (upstream, timer) = (config.upstream, config.timer);
    match run_blocking(config, |addr, _| {
        println!(
            "corewheel-proxy listening on http://{addr}, upstream {upstream}, timers on {}",
            timer.name()
        )
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corewheel-proxy: {error}");
            ExitCode::FAILURE
        }
    }
}
