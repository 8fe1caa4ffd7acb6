/*!
Pushed telemetry (`[telemetry]`): every `interval_secs` the exposition `/metrics` would
serve is read back into series, stamped with the time, labelled with the gateway
(`job="tapegate"`, `instance` and `gateway` = `[gateway] id`) and pushed with
Prometheus remote write 1.0 (protobuf, snappy, `X-Prometheus-Remote-Write-Version:
0.1.0`) to the configured receiver: for docks behind NAT, proxies and LTE that no
Prometheus can scrape.
It touches the metrics registry, the outbox's reads and the config.

Why remote write and not OTLP: every collector a fleet is likely to run takes it as is
(Prometheus with `--web.enable-remote-write-receiver`, Mimir, Thanos Receive,
VictoriaMetrics, Grafana Cloud, the OpenTelemetry Collector's receiver), the series
are exactly those a scrape of `/metrics` gives (so the shipped alert rules and
dashboard work on either path), and its messages are few enough to write by hand
(`remote_write.rs`) instead of adding an OTLP/protobuf stack to a 9 MB binary.

What it promises:
- **No effect on capture or delivery.** Its own task and HTTP client; it reads the
  state database once a push (the same read a scrape makes) and never waits on a
  stage. A receiver that hangs costs it `timeout_secs`, nobody else.
- **Outages survived, memory bounded.** A push that fails for a reason that can pass
  (connection, timeout, 429, 5xx) is kept and sent, in order, when the receiver answers
  again; at most `max_buffered` pushes are kept, the oldest dropped first and counted
  (`tapegate_telemetry_dropped_total`). A push the receiver refuses (another 4xx: out
  of order, out of bounds, bad credentials) is dropped and counted, not retried
  forever. The log says when pushes start failing and when they recover, once each.
- **No secret.** The credential goes only in the `Authorization` header; what the
  receiver answers is bounded and scrubbed of it before it reaches the log.
*/

pub mod remote_write;

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::{TelemetryAuth, TelemetrySettings};
use crate::metrics::{Metrics, PushOutcome};
use crate::outbox::Reader;
use crate::record::EpochMillis;
use crate::util::secret::{scrub, Secret};

/// Most of a refusal's answer kept for the log.
const MAX_ANSWER_SHOWN: usize = 300;

/// Why the pusher cannot start.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the telemetry client: {0}")]
pub struct SetupError(String);

/// The first bytes of an answer (a refusal's reason), however long it is.
async fn answer_start(mut resp: reqwest::Response) -> String {
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        buf.extend_from_slice(&chunk);
        if buf.len() >= 4 * MAX_ANSWER_SHOWN {
            break;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// One push: its time and its compressed `WriteRequest`.
struct Push {
    at: EpochMillis,
    body: Bytes,
}

/// What a send came to.
enum Sent {
    Ok,
    /// The receiver refused it for good (a 4xx other than 429): drop it.
    Refused(String),
    /// It may work later (transport, timeout, 429, 5xx): keep it.
    Failed(String),
}

/// The pusher: settings, client, and the pushes not yet sent.
pub struct Pusher {
    settings: TelemetrySettings,
    http: reqwest::Client,
    labels: Vec<(String, String)>,
    metrics: Arc<Metrics>,
    /// Each push's time, by the daemon's clock.
    clock: SharedClock,
    buffer: VecDeque<Push>,
    /// Whether the last attempt failed (the log says so once).
    failing: bool,
}

impl Pusher {
    /// A pusher for `settings`, labelling every series with `gateway_id`.
    pub fn new(
        settings: TelemetrySettings,
        gateway_id: &str,
        metrics: Arc<Metrics>,
        clock: SharedClock,
    ) -> Result<Pusher, SetupError> {
        let roots = crate::api::trust::system();
        let mut builder = crate::api::trust::trusting(reqwest::Client::builder(), roots);
        if let Some(ca) = &settings.ca_file {
            let certs = reqwest::Certificate::from_pem_bundle(&ca.pem).map_err(|e| {
                SetupError(format!(
                    "telemetry.ca_file {} cannot be used: {e}",
                    ca.path.display()
                ))
            })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        // HTTPS_PROXY, HTTP_PROXY and NO_PROXY are honoured, as for the service.
        let http = builder
            .use_rustls_tls()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tapegate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SetupError(format!("{e}")))?;
        let labels = vec![
            ("job".to_string(), "tapegate".to_string()),
            ("instance".to_string(), gateway_id.to_string()),
            ("gateway".to_string(), gateway_id.to_string()),
        ];
        Ok(Pusher {
            settings,
            http,
            labels,
            metrics,
            clock,
            buffer: VecDeque::new(),
            failing: false,
        })
    }

    /// Takes the pushes `old` had not sent yet (a reload), oldest dropped past
    /// `max_buffered`.
    pub fn take_buffer_from(&mut self, mut old: Pusher) {
        old.buffer.append(&mut self.buffer);
        self.buffer = std::mem::take(&mut old.buffer);
        while self.buffer.len() > self.settings.max_buffered.max(1) {
            self.buffer.pop_front();
            self.metrics.telemetry_push(PushOutcome::Dropped);
        }
        self.failing = old.failing;
        self.metrics.telemetry_buffered(self.buffer.len());
    }

    /// Pushes every interval until `stop`, the first at once; returns itself with the
    /// pushes not yet sent.
    pub async fn run(mut self, outbox: Reader, stop: CancellationToken) -> Pusher {
        tracing::info!(
            url = %self.settings.url,
            interval_secs = self.settings.interval.as_secs(),
            "pushing telemetry (Prometheus remote write)"
        );
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            match outbox.stats().await {
                Ok(stats) => {
                    let at = self.clock.wall_ms();
                    match self.metrics.encode(&stats, at) {
                        Ok(text) => self.snapshot(&text, at),
                        Err(_) => tracing::warn!("telemetry: cannot encode the metrics"),
                    }
                }
                // The push is skipped, and the next one carries the state.
                Err(e) => tracing::warn!(error = %e, "telemetry: cannot read the state database"),
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.drain() => {}
            }
        }
        self
    }

    /// Turns the exposition `text` as of `at` into a push at the back of the buffer,
    /// dropping the oldest past `max_buffered`.
    pub fn snapshot(&mut self, text: &str, at: EpochMillis) {
        let labels: Vec<(&str, &str)> = self
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let series = match remote_write::parse_exposition(text, &labels) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "telemetry: push skipped");
                return;
            }
        };
        let body = remote_write::encode_write_request(&series, at);
        let body = match snap::raw::Encoder::new().compress_vec(&body) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                tracing::warn!(error = %e, "telemetry: cannot compress a push");
                return;
            }
        };
        self.buffer.push_back(Push { at, body });
        while self.buffer.len() > self.settings.max_buffered.max(1) {
            self.buffer.pop_front();
            self.metrics.telemetry_push(PushOutcome::Dropped);
        }
        self.metrics.telemetry_buffered(self.buffer.len());
    }

    /// Sends the buffered pushes, oldest first, until one fails for a reason that may
    /// pass.
    pub async fn drain(&mut self) {
        let mut sent = 0usize;
        while let Some(push) = self.buffer.front() {
            let outcome = self.send(push.body.clone()).await;
            let at = push.at;
            match outcome {
                Sent::Ok => {
                    self.buffer.pop_front();
                    self.metrics.telemetry_push(PushOutcome::Sent);
                    sent += 1;
                }
                Sent::Refused(why) => {
                    self.buffer.pop_front();
                    self.metrics.telemetry_push(PushOutcome::Refused);
                    tracing::warn!(at, "telemetry: the receiver refused a push, dropped: {why}");
                }
                Sent::Failed(why) => {
                    self.metrics.telemetry_push(PushOutcome::Failed);
                    if !self.failing {
                        tracing::warn!(
                            buffered = self.buffer.len(),
                            max_buffered = self.settings.max_buffered,
                            "telemetry: push failed, keeping it to send later: {why}"
                        );
                    }
                    self.failing = true;
                    break;
                }
            }
        }
        if self.failing && sent > 0 && self.buffer.is_empty() {
            tracing::info!(
                sent,
                "telemetry: the receiver answers again; every kept push sent"
            );
            self.failing = false;
        } else if sent > 0 && self.buffer.is_empty() {
            self.failing = false;
        }
        self.metrics.telemetry_buffered(self.buffer.len());
    }

    /// Pushes kept, not yet sent.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    async fn send(&self, body: Bytes) -> Sent {
        let mut req = self
            .http
            .post(self.settings.url.clone())
            .header(CONTENT_ENCODING, HeaderValue::from_static("snappy"))
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            )
            .header(
                "X-Prometheus-Remote-Write-Version",
                HeaderValue::from_static("0.1.0"),
            )
            .body(body);
        let mut secrets: Vec<&str> = Vec::new();
        match &self.settings.auth {
            TelemetryAuth::None => {}
            TelemetryAuth::Basic { username, password } => {
                let pw = password.as_ref().map(Secret::expose);
                secrets.extend(pw);
                req = req.basic_auth(username, pw);
            }
            TelemetryAuth::Bearer(token) => {
                if let Some(t) = token {
                    secrets.push(t.expose());
                    req = req.bearer_auth(t.expose());
                }
            }
        }
        let resp = match req.send().await {
            Ok(r) => r,
            // reqwest's error names the URL, which holds no credential (refused at load).
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "cannot connect"
                } else {
                    "request failed"
                };
                return Sent::Failed(scrub(&format!("{kind}: {e}"), &secrets));
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Sent::Ok;
        }
        let text = answer_start(resp).await;
        let why = format!(
            "{status}: {}",
            crate::util::text::shown(&scrub(text.trim(), &secrets), MAX_ANSWER_SHOWN)
        );
        if status.as_u16() == 429 || status.is_server_error() {
            Sent::Failed(why)
        } else {
            Sent::Refused(why)
        }
    }
}
