//! What every operator command (`device`, `locate`, `history`, `message`) shares: the
//! operator's client ([`operator_on`]) with its waits and retries told on stderr, Ctrl-C
//! ([`interrupts`]: the first stops before the next request and the results so far are
//! printed; the second gives up the request in flight), and a long run's estimate and
//! progress on a terminal ([`Console`]). It may touch the operator room, the config and
//! the state database (the rate window, re-queued dead letters).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::CmdError;
use crate::api::ServiceClient;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::operator::rate::RateGate;
use crate::operator::{Interrupt, Operator, OperatorError};
use crate::outbox::{DeviceState, OutboxError};

/// The state database for the device commands: the daemon's, or a new one.
pub(crate) fn state(config: &Config) -> Result<DeviceState, OutboxError> {
    DeviceState::open(&config.gateway.state_dir)
}

/// What the commands tell a person on stderr while they run: waits, retries, the
/// estimate, and (on a terminal only) one progress line kept up to date.
#[derive(Clone)]
pub struct Console {
    tty: bool,
    /// A progress line is on the screen (it is cleared before any other line).
    shown: Arc<AtomicBool>,
}

impl Console {
    pub fn stderr() -> Console {
        Console {
            tty: std::io::stderr().is_terminal(),
            shown: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A line for a person (a progress line is cleared first).
    pub fn say(&self, message: &str) {
        let clear = if self.shown.swap(false, Ordering::Relaxed) {
            "\r\x1b[K"
        } else {
            ""
        };
        // A closed stderr (`... 2>&1 | head -1`) is no reason to fail, or panic.
        let _ = writeln!(
            std::io::stderr(),
            "{clear}{}",
            crate::util::text::inert(message)
        );
    }

    /// The progress line, on a terminal only.
    pub(super) fn progress(&self, line: &str) {
        if self.tty {
            self.shown.store(true, Ordering::Relaxed);
            let _ = write!(std::io::stderr(), "\r\x1b[K{line}");
        }
    }

    /// Ends the progress line.
    pub(super) fn done(&self) {
        if self.shown.swap(false, Ordering::Relaxed) {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// `d` for a person: "41 s", "3 min 20 s", "8 h 27 min".
pub fn human(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_millis() >= 500);
    match s {
        0 => "less than a second".to_string(),
        1..=59 => format!("{s} s"),
        60..=3599 if s % 60 == 0 => format!("{} min", s / 60),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The operator's client for `config`: waits and retries are told on `console`. A
/// missing `[service]` or settings that cannot make a client are config errors (exit 2).
pub fn operator_on(
    config: &Config,
    clock: &SharedClock,
    console: &Console,
) -> Result<Operator, CmdError> {
    let no_service = || CmdError::Usage(CmdError::NoService.to_string());
    let service = config.service.as_ref().ok_or_else(no_service)?;
    let settings = config.operator.clone().ok_or_else(no_service)?;
    let client =
        ServiceClient::new(service, clock.clone()).map_err(|e| CmdError::Usage(e.to_string()))?;
    let identity = format!(
        "{}/{}/{}",
        service.environment, service.endpoint.client_id, service.endpoint.username
    );
    let waits = console.clone();
    let gate = RateGate::new(
        config.gateway.state_dir.clone(),
        identity,
        settings.rate_window,
        clock.clone(),
        Box::new(move |d: Duration| {
            waits.say(&format!(
                "waiting {} s for the service's rate window",
                d.as_secs_f64().ceil() as u64
            ));
        }),
    )
    .map_err(|e| CmdError::Failed(format!("could not start the rate window's thread: {e}")))?;
    let retries = console.clone();
    Ok(Operator::new(
        client,
        gate,
        settings,
        config.gateway.id.clone(),
        Box::new(move |m: &str| retries.say(m)),
    ))
}

/// The operator's client for `config`, telling waits and retries on stderr.
pub fn operator(config: &Config, clock: &SharedClock) -> Result<Operator, CmdError> {
    operator_on(config, clock, &Console::stderr())
}

/// Ctrl-C (SIGINT) and SIGTERM for a run: the first stops it before the next request
/// (and ends any wait), the second gives up the request in flight. Must be called on
/// the runtime.
pub fn interrupts(console: &Console) -> Interrupt {
    let interrupt = Interrupt::default();
    let i = interrupt.clone();
    let console = console.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        async fn next(
            int: &mut tokio::signal::unix::Signal,
            term: &mut tokio::signal::unix::Signal,
        ) {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        next(&mut int, &mut term).await;
        console.say("interrupted: nothing more is sent; the request on its way is finished (interrupt again to give it up)");
        i.stop.cancel();
        next(&mut int, &mut term).await;
        console.say("interrupted again: giving up the request on its way");
        i.abandon.cancel();
    });
    interrupt
}

impl From<OperatorError> for CmdError {
    fn from(e: OperatorError) -> Self {
        match e {
            OperatorError::Usage(m) => CmdError::Usage(m),
            OperatorError::Api(crate::api::ApiError::Setup(m)) => CmdError::Usage(m),
            OperatorError::Api(a) => CmdError::Api(a),
            OperatorError::State(s) => CmdError::Outbox(s),
            other => CmdError::Failed(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(human(Duration::from_secs(3)), "3 s");
        assert_eq!(human(Duration::from_secs(200)), "3 min 20 s");
        assert_eq!(human(Duration::from_secs(120)), "2 min");
        assert_eq!(human(Duration::from_secs(499 * 61)), "8 h 27 min");
    }
}
