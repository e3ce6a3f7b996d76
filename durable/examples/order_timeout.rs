//! Orders cancelled when unpaid after a delay, surviving `kill -9` and a restart.
//!
//! `cargo run -p corewheel-durable --example order_timeout -- <dir> [orders] [delay ms]`
//! places `orders` orders, each with a timeout `delay ms` out, and pays every other one in
//! time (cancelling its timeout). Unpaid orders are cancelled by the handler. Kill the
//! process at any point and run it again with `0` orders: the timeouts still pending fire
//! after the restart, and none that was acked fires again.

use std::time::{Duration, SystemTime};

use corewheel_durable::{DurableTimers, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "order-timeouts".into());
    let orders: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
    let delay = Duration::from_millis(args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2000));

    let timers = DurableTimers::open(&dir, Options::default().catch_up_rate(1000))?;
    timers.run_handler(2, |task| {
        // Idempotent by order id: cancelling an already cancelled order is a no-op.
        println!(
            "order {} unpaid after its delay: cancelled (attempt {})",
            String::from_utf8_lossy(task.id()),
            task.attempt()
        );
        Ok::<(), std::io::Error>(())
    })?;
    let run = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs();
    for n in 0..orders {
        let id = format!("order-{run}-{n}");
        timers.schedule(&id, b"customer=42", SystemTime::now() + delay)?;
        println!("placed {id}");
        if n % 2 == 0 {
            timers.cancel(&id)?;
            println!("paid {id}");
        }
    }
    std::thread::sleep(delay + Duration::from_secs(1));
    timers.close()?;
    Ok(())
}
