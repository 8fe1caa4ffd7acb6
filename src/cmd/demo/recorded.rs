//! `tapegate mock --record FILE`: the mock service that also writes down, as it comes,
//! every decode item it receives, one JSON line each (`mac_id`, `ble_packet`,
//! `scan_time`, `product_id`, the answer's `status`), so that a test outside the
//! process (the VM tests, through their shared directory) reads what a gateway
//! delivered. It touches the mock service only.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tapegate_mock::{self as mock, MockConfig};

/// How often what was received is written out.
const WRITE_EVERY: Duration = Duration::from_millis(200);

/// Serves `config` on `listen` until Ctrl-C or SIGTERM, appending each decode item
/// received to `path` (flushed every [`WRITE_EVERY`]).
pub async fn serve(listen: SocketAddr, config: MockConfig, path: &Path) -> std::io::Result<()> {
    let handle = mock::start_on(listen, config).await?;
    handle.set_record_limit(usize::MAX);
    println!(
        "mock service on {}, recording to {}",
        handle.addr(),
        path.display()
    );
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut written = 0;
    loop {
        let stop = tokio::select! {
            _ = tokio::signal::ctrl_c() => true,
            _ = term.recv() => true,
            () = tokio::time::sleep(WRITE_EVERY) => false,
        };
        let received = handle.received();
        for r in received.iter().skip(written) {
            for item in &r.items {
                let line = serde_json::json!({
                    "mac_id": item.mac_id,
                    "ble_packet": item.ble_packet,
                    "scan_time": item.scan_time,
                    "product_id": item.product_id,
                    "status": r.status,
                });
                writeln!(file, "{line}")?;
            }
        }
        written = received.len();
        file.flush()?;
        if stop {
            handle.shutdown().await;
            return Ok(());
        }
    }
}
