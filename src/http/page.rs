//! The status page (`/`): what an installer at the dock wants on a phone. The tapes
//! heard in the last [`HEARD_WINDOW`] with what the service said of them, the outbox's
//! health and the scanner's state, as one self-refreshing HTML document with its style
//! inline (no external asset: the dock may have no internet). Every value is escaped.

use std::fmt::Write;

use hyper::StatusCode;

use super::answer::{text, Answer, HttpState};
use crate::clock::{age, rfc3339};
use crate::health::{self, Unhealthy};
use crate::heard_now::Seen;
use crate::outbox::{Stats, TapeKnown};
use crate::record::EpochMillis;

/// A tape heard within this long is "heard now".
pub const HEARD_WINDOW_MS: EpochMillis = 5 * 60 * 1000;

/// Tapes listed at most.
pub const MAX_TAPES: usize = 100;

/// The page reloads itself this often (seconds).
pub const REFRESH_SECS: u32 = 5;

/// Everything the page shows, gathered first so that drawing it is pure.
struct View {
    gateway_id: String,
    source: String,
    now: EpochMillis,
    health: Result<(), Unhealthy>,
    tapes: Vec<(Seen, TapeKnown)>,
    /// `Err`: the state database could not be read, and why.
    stats: Result<Stats, String>,
    adverts: u64,
    /// When a tape was last heard, however long ago.
    last_heard: Option<EpochMillis>,
    /// The scanner's last trouble, as the daemon knows it now or the database kept it.
    trouble: Option<(String, EpochMillis)>,
    /// Where the BLE source reads adverts (`mgmt`, `dbus`), and its reports per second.
    adverts_path: Option<&'static str>,
    reports_per_sec: Option<f64>,
}

pub(super) async fn render(state: &HttpState) -> Answer {
    let now = state.clock.wall_ms();
    let seen = state.heard.since(now - HEARD_WINDOW_MS, MAX_TAPES);
    let last_heard = state.heard.since(EpochMillis::MIN, 1).first().map(|s| s.at);
    let macs: Vec<_> = seen.iter().map(|s| s.mac).collect();
    let read = state.outbox.stats_and_known(macs).await;
    let (stats, tapes) = match read {
        Ok((stats, known)) => (Ok(stats), seen.into_iter().zip(known).collect()),
        Err(e) => {
            let blank = TapeKnown {
                reading: None,
                refused: None,
            };
            let tapes = seen.into_iter().map(|s| (s, blank.clone())).collect();
            (Err(e.to_string()), tapes)
        }
    };
    let live_trouble = state
        .source_health
        .last_trouble
        .lock()
        .ok()
        .and_then(|t| t.clone());
    let stored_trouble = stats.as_ref().ok().and_then(|s| {
        s.scanner_last_trouble
            .clone()
            .zip(s.scanner_last_trouble_at)
    });
    let view = View {
        gateway_id: state.gateway_id.clone(),
        source: state.source.clone(),
        now,
        health: health::verdict(&state.liveness, &state.admission, &state.metrics),
        tapes,
        stats,
        adverts: state.metrics.adverts(),
        last_heard,
        trouble: live_trouble.or(stored_trouble),
        adverts_path: state.source_health.adverts_path(),
        reports_per_sec: state.source_health.reports_per_sec(),
    };
    text(StatusCode::OK, "text/html; charset=utf-8", html(&view))
}

/// Text from elsewhere (the service, BlueZ, the database) for the page: bounded, with
/// controls and bidi overrides shown escaped, then HTML-escaped.
fn foreign(s: &str) -> String {
    esc(&crate::util::text::shown(
        s,
        crate::util::text::SHOWN_MAX_CHARS,
    ))
}

/// `s` with the five characters that mean something in HTML escaped.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ago(at: EpochMillis, now: EpochMillis) -> String {
    format!("{} ago", age(((now - at).max(0) / 1000) as u64))
}

const STYLE: &str =
    "body{font-family:system-ui,sans-serif;margin:0;padding:.6em;background:#fafafa;color:#222}\
h1{font-size:1.2em;margin:.2em 0}h2{font-size:1em;margin:1em 0 .3em}\
.ok{color:#060}.bad{color:#a00}.muted{color:#777}\
.banner{padding:.5em;border-radius:.3em;font-weight:bold}\
.banner.ok{background:#e3f5e3}.banner.bad{background:#fbe3e3}\
ul{list-style:none;padding:0;margin:0}\
li{background:#fff;border:1px solid #ddd;border-radius:.3em;padding:.4em .5em;margin:.3em 0}\
.mac{font-family:monospace;font-weight:bold}.qr{font-family:monospace}\
.service{float:right;font-weight:bold}.why{font-size:.8em;color:#a00}dl{display:grid;grid-template-columns:auto 1fr;gap:.2em .8em;margin:0}\
dt{color:#555}dd{margin:0}";

fn html(v: &View) -> String {
    let mut h = String::with_capacity(8 * 1024);
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
<title>tapegate {id}</title><style>{STYLE}</style></head><body>\
<h1>tapegate <span id=\"gateway\">{id}</span></h1>\
<p class=\"muted\">{now} · refreshes every {REFRESH_SECS} s</p>",
        id = esc(&v.gateway_id),
        now = rfc3339(v.now),
    );
    match &v.health {
        Ok(()) => h.push_str(
            "<p id=\"health\" class=\"banner ok\">Healthy: every stage is making progress</p>",
        ),
        Err(u) => {
            let _ = write!(
                h,
                "<p id=\"health\" class=\"banner bad\">Not healthy: {}: {}</p>",
                esc(u.stage),
                foreign(&u.reason)
            );
        }
    }
    tapes(&mut h, v);
    outbox(&mut h, v);
    scanner(&mut h, v);
    h.push_str("</body></html>\n");
    h
}

/// One card per tape, not a wide table: the whole of it fits a phone held upright.
fn tapes(h: &mut String, v: &View) {
    let _ = write!(
        h,
        "<h2>Tapes heard now ({} in the last {} min)</h2>",
        v.tapes.len(),
        HEARD_WINDOW_MS / 60_000
    );
    if v.tapes.is_empty() {
        h.push_str("<p class=\"muted\">No tape heard yet.</p>");
        return;
    }
    h.push_str("<ul id=\"tapes\">");
    for (seen, known) in &v.tapes {
        let reading = known.reading.as_ref();
        let service = match (reading, &known.refused) {
            (Some(_), _) => "<span class=\"service ok\">known</span>".to_string(),
            (None, Some(error)) => format!(
                "<span class=\"service bad\">unknown</span><div class=\"why\">{}</div>",
                foreign(error)
            ),
            (None, None) => "<span class=\"service muted\">not answered yet</span>".to_string(),
        };
        let mut values = vec![seen.rssi.map_or("RSSI –".to_string(), |r| {
            format!("<span class=\"rssi\">{r} dBm</span>")
        })];
        if let Some(t) = reading.and_then(|r| r.temp) {
            values.push(format!("<span class=\"temp\">{t:.1} °C</span>"));
        }
        if let Some(b) = reading.and_then(|r| r.bat) {
            values.push(format!("<span class=\"bat\">battery {b:.0}</span>"));
        }
        values.push(format!("heard {}", ago(seen.at, v.now)));
        let _ = write!(
            h,
            "<li data-mac=\"{mac}\"><div><span class=\"mac\">{mac}</span> \
<span class=\"qr\">{qr}</span> {service}</div><div>{values}</div></li>",
            mac = esc(&seen.mac.to_string()),
            qr = foreign(reading.and_then(|r| r.qr_code.as_deref()).unwrap_or("")),
            values = values.join(" · "),
        );
    }
    h.push_str("</ul>");
}

fn outbox(h: &mut String, v: &View) {
    h.push_str("<h2>Outbox</h2>");
    let s = match &v.stats {
        Ok(s) => s,
        Err(e) => {
            let _ = write!(
                h,
                "<p class=\"bad\">Cannot read the state database: {}</p>",
                foreign(e)
            );
            return;
        }
    };
    let oldest = s
        .oldest_pending_at
        .map(|t| format!(", oldest captured {}", ago(t, v.now)))
        .unwrap_or_default();
    let last_ok = s
        .last_flush_ok_at
        .map_or("never".to_string(), |t| ago(t, v.now));
    // An error older than the last good flush is history, not the state now.
    let error = match (&s.last_error, s.last_error_at) {
        (Some(e), Some(at)) if s.last_flush_ok_at.is_none_or(|ok| at > ok) => {
            format!(
                "<span class=\"bad\">{}</span> ({})",
                foreign(e),
                ago(at, v.now)
            )
        }
        (Some(e), Some(at)) => format!("{} ({}, since recovered)", foreign(e), ago(at, v.now)),
        _ => "none".to_string(),
    };
    let _ = write!(
        h,
        "<dl id=\"outbox\"><dt>Pending</dt><dd>{pending}{oldest}</dd>\
<dt>Delivered</dt><dd>{delivered}</dd><dt>Dead letters</dt><dd>{dead}</dd>\
<dt>Evicted</dt><dd>{evicted}</dd><dt>Last flush</dt><dd>{last_ok}</dd>\
<dt>Last error</dt><dd>{error}</dd></dl>",
        pending = s.pending,
        delivered = s.delivered,
        dead = s.dead_letters,
        evicted = s.evicted,
    );
}

fn scanner(h: &mut String, v: &View) {
    let _ = write!(
        h,
        "<h2>Scanner</h2><dl id=\"scanner\"><dt>Source</dt><dd>{source}</dd>\
<dt>Adverts heard</dt><dd>{adverts} since start</dd><dt>Last tape heard</dt><dd>{last}</dd>",
        source = esc(&v.source),
        adverts = v.adverts,
        last = v.last_heard.map_or("never".to_string(), |t| ago(t, v.now)),
    );
    if let Some(path) = v.adverts_path {
        let how = match path {
            "mgmt" => "the kernel's management socket (side channel)",
            _ => "BlueZ over D-Bus",
        };
        let rate = v
            .reports_per_sec
            .map_or(String::new(), |r| format!(", {r:.1} reports/s"));
        let _ = write!(
            h,
            "<dt>Adverts read from</dt><dd id=\"adverts-path\" data-path=\"{path}\">{how}{rate}</dd>"
        );
    }
    if let Ok(s) = &v.stats {
        let c = &s.scanner;
        let _ = write!(
            h,
            "<dt>Recoveries</dt><dd>{} scan restarts, {} adapter re-acquisitions</dd>\
<dt>Dropped</dt><dd>{} adverts (pipeline behind), {} devices forgotten</dd>",
            c.restarts, c.reacquires, c.dropped, c.forgotten
        );
    }
    if let Some((reason, at)) = &v.trouble {
        let _ = write!(
            h,
            "<dt>Last trouble</dt><dd>{} ({})</dd>",
            foreign(reason),
            ago(*at, v.now)
        );
    }
    h.push_str("</dl>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::TapeRow;
    use crate::record::Mac;

    fn view() -> View {
        let mac = Mac::new([0xC0, 0xFF, 0xEE, 0, 0, 1]);
        View {
            gateway_id: "dock-<7>".into(),
            source: "sim".into(),
            now: 100_000,
            health: Ok(()),
            tapes: vec![(
                Seen {
                    mac,
                    rssi: Some(-61),
                    at: 90_000,
                    best_rssi: Some(-61),
                    best_at: 90_000,
                    known: None,
                },
                TapeKnown {
                    reading: Some(TapeRow {
                        mac,
                        qr_code: Some("<script>alert(1)</script>".into()),
                        captured_at: 90_000,
                        decoded_at: 91_000,
                        rssi: Some(-61),
                        temp: Some(4.25),
                        bat: Some(87.0),
                    }),
                    refused: None,
                },
            )],
            stats: Ok(Stats {
                pending: 3,
                last_error: Some("server error 503 & \"more\"".into()),
                last_error_at: Some(95_000),
                ..Stats::default()
            }),
            adverts: 42,
            last_heard: Some(90_000),
            trouble: None,
            adverts_path: Some("mgmt"),
            reports_per_sec: Some(95.04),
        }
    }

    #[test]
    fn the_page_shows_where_adverts_are_read_and_how_many_per_second() {
        let page = html(&view());
        assert!(
            page.contains("the kernel's management socket (side channel), 95.0 reports/s"),
            "{page}"
        );
        let mut v = view();
        v.adverts_path = Some("dbus");
        v.reports_per_sec = None;
        let page = html(&v);
        assert!(page.contains(">BlueZ over D-Bus</dd>"), "{page}");
    }

    #[test]
    fn every_value_on_the_page_is_escaped() {
        let page = html(&view());
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("dock-&lt;7&gt;"));
        assert!(page.contains("server error 503 &amp; &quot;more&quot;"));
    }

    #[test]
    fn a_tape_row_shows_mac_rssi_reading_and_age() {
        let page = html(&view());
        for part in [
            "<span class=\"mac\">C0:FF:EE:00:00:01</span>",
            ">-61 dBm<",
            ">4.2 °C<",
            ">battery 87<",
            ">known<",
            "heard 10s ago",
            "<dt>Last tape heard</dt><dd>10s ago</dd>",
        ] {
            assert!(page.contains(part), "no {part:?} in {page}");
        }
    }

    #[test]
    fn the_page_refreshes_itself_and_loads_nothing_from_elsewhere() {
        let page = html(&view());
        assert!(page.contains(&format!(
            "http-equiv=\"refresh\" content=\"{REFRESH_SECS}\""
        )));
        for external in ["src=", "href=", "url(", "@import"] {
            assert!(!page.contains(external), "{external} in {page}");
        }
    }

    #[test]
    fn an_unhealthy_stage_is_named_on_the_page() {
        let mut v = view();
        v.health = Err(Unhealthy {
            stage: "flush",
            reason: "3 requests to the service failed in a row (last: timeout)".into(),
        });
        let page = html(&v);
        assert!(page.contains("Not healthy: flush: 3 requests"), "{page}");
    }
}
