//! An outage long enough to fill the outbox: the oldest captures are evicted and never
//! sent afterwards, the newest delivered when it ends.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{eventually_async, Gateway};
use tapegate_mock::{self as mock, Fault, MockConfig, MockHandle};

use super::support::*;

/// The outage of issue 19: the service down (503), `outbox.max_pending = 1000`, 3,000
/// captures. The outbox evicts 2,000 while batches fail, are parked and split; when the
/// service comes back, it gets exactly the 1,000 captures the outbox kept: none that
/// `status` counts evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_evicts_2000_of_3000_captures_never_sends_one_of_them_afterwards() {
    let mock = start_mock().await;
    fail_every_request(
        &mock,
        Fault::Status {
            status: 503,
            retry_after: None,
        },
    );
    let k = Knobs {
        max_pending: 1000,
        backoff_max_secs: 1,
        ..Knobs::default()
    };
    let g = Gateway::new("");
    let mut live = Live::start(&mock, &g, &k).await;
    let shots = trace(1500, 0, 2);
    let limit = Duration::from_secs(30);
    // In steps, so that batches are found, fail and wait while the outbox evicts.
    for (i, chunk) in shots.chunks(500).enumerate() {
        let before = mock.decode_requests();
        live.send(chunk);
        let admitted = ((i + 1) * 500) as u64;
        eventually_async(limit, async || {
            stats_now(&g).is_some_and(|s| s.admitted == admitted) && mock.decode_requests() > before
        })
        .await
        .expect("timed out waiting for the step admitted and a request failed");
    }
    let s = stats_now(&g).unwrap();
    assert_eq!((s.admitted, s.evicted, s.pending), (3000, 2000, 1000));
    let kept: HashSet<Key> = g
        .store()
        .pending_captures()
        .unwrap()
        .iter()
        .map(|p| (p.capture.mac.plain(), p.capture.packet.clone()))
        .collect();
    assert_eq!(kept.len(), 1000);

    mock.set_storm(None);
    live.finish().await;
    let s = g.stats();
    assert_eq!(
        (
            s.admitted,
            s.delivered,
            s.dead_letters,
            s.evicted,
            s.pending
        ),
        (3000, 1000, 0, 2000, 0)
    );
    let decoded = tally(bulk_requests(&mock).iter().filter(|r| answered(r)));
    let evicted_then_delivered = decoded.keys().filter(|k| !kept.contains(*k)).count();
    println!(
        "outage: 3000 captures, max_pending 1000: {} evicted, {} delivered; captures delivered after being counted evicted: {evicted_then_delivered}",
        s.evicted, s.delivered
    );
    assert_eq!(
        evicted_then_delivered, 0,
        "the service got evicted captures"
    );
    assert_eq!(decoded.len(), 1000);
    assert_eq!(mock.decoded_items(), 1000, "each kept capture decoded once");
}

/// In an outage the oldest captures are evicted and the newest delivered when it ends.
///
/// Issue 32: the service unreachable (connection refused), 3,000 captures over 300
/// tapes, `outbox.max_pending = 1000`: the outbox evicts by age order whatever the
/// flusher holds back, and when the service returns it gets exactly the newest 1,000
/// captures, none of the 2,000 older ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_an_outage_the_oldest_are_evicted_and_the_newest_delivered() {
    let mock = start_mock().await;
    let addr = mock.addr();
    let k = Knobs {
        max_pending: 1000,
        ..Knobs::default()
    };
    let g = Gateway::new("");
    let mut live = Live::start(&mock, &g, &k).await;
    // Nothing listens there any more: every connection is refused.
    mock.shutdown().await;
    let shots = trace(300, 0, 10);
    live.send(&shots);
    until_evicted(&g, 3000, 2000).await;
    assert_only_the_newest_kept(&g, &shots[2000..]);

    let mock = mock::start_on(addr, MockConfig::demo())
        .await
        .expect("the service returns");
    assert_the_newest_delivered(live, &mock, &g, &shots[2000..]).await;
}

/// A batch waiting for its token in an outage holds no claim, and the oldest are
/// evicted.
///
/// Issue 32, the same outage with the service's address taking connections and never
/// answering (an uplink that drops the answers): the first batch waits for its token
/// for as long as the outage lasts. Waiting, it holds no claim: the oldest captures,
/// its own among them, are evicted as newer ones come, and the newest are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waiting_for_its_token_in_an_outage_holds_no_claim() {
    let mock = start_mock().await;
    let addr = mock.addr();
    let k = Knobs {
        max_pending: 1000,
        request_timeout_secs: 60,
        ..Knobs::default()
    };
    let g = Gateway::new("");
    let mut live = Live::start(&mock, &g, &k).await;
    mock.shutdown().await;
    let silent = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the silent service binds");
    let shots = trace(300, 0, 10);
    live.send(&shots[..300]);
    // The first batch is found and waits for the token its request needs.
    let (held, _) = tokio::time::timeout(Duration::from_secs(20), silent.accept())
        .await
        .expect("the token request comes")
        .unwrap();
    live.send(&shots[300..]);
    until_evicted(&g, 3000, 2000).await;
    assert_only_the_newest_kept(&g, &shots[2000..]);

    drop((held, silent));
    let mock = mock::start_on(addr, MockConfig::demo())
        .await
        .expect("the service returns");
    assert_the_newest_delivered(live, &mock, &g, &shots[2000..]).await;
}

async fn until_evicted(g: &Gateway, admitted: u64, evicted: u64) {
    eventually_async(Duration::from_secs(30), async || {
        stats_now(g).is_some_and(|s| (s.admitted, s.evicted) == (admitted, evicted))
    })
    .await
    .expect("timed out waiting for the captures admitted and evicted");
}

/// The outbox holds exactly `newest`.
fn assert_only_the_newest_kept(g: &Gateway, newest: &[Shot]) {
    let kept: HashSet<Key> = g
        .store()
        .pending_captures()
        .unwrap()
        .iter()
        .map(|p| (p.capture.mac.plain(), p.capture.packet.clone()))
        .collect();
    let want: HashSet<Key> = newest.iter().map(Shot::key).collect();
    let older = kept.difference(&want).count();
    assert_eq!(
        older, 0,
        "{older} older captures kept and as many of the newest evicted"
    );
    assert_eq!(kept, want);
}

/// Ends the trace, waits for the drain, and checks that the service got `newest`
/// and nothing else, each once.
async fn assert_the_newest_delivered(live: Live, mock: &MockHandle, g: &Gateway, newest: &[Shot]) {
    live.finish().await;
    let s = g.stats();
    let n = newest.len() as u64;
    assert_eq!(
        (s.delivered, s.dead_letters, s.evicted, s.pending),
        (n, 0, s.admitted - n, 0)
    );
    let decoded = tally(bulk_requests(mock).iter().filter(|r| answered(r)));
    let want: HashSet<Key> = newest.iter().map(Shot::key).collect();
    assert_eq!(decoded.keys().cloned().collect::<HashSet<Key>>(), want);
    assert!(decoded.values().all(|n| *n == 1), "each decoded once");
}
