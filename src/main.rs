//! The thin binary: parse the command line, load the config, start logging, call the
//! library, map errors to exit codes (0 ok, 2 bad config or usage, 3 the configured
//! source cannot work on this machine, 4 `run --until-drained` stopped before it
//! drained, 5 this user cannot write the state, 6 the state database is newer than this
//! tapegate, 1 anything else).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use tapegate::cli::{Cli, Command, DeadLetters};
use tapegate::cmd::CmdError;
use tapegate::config::{self, Config, ConfigError, Password};
use tapegate::pipeline::{
    self, Reload, RunError, RunOptions, SetLogLevel, EXIT_STATE_NOT_WRITABLE, EXIT_UNDRAINED,
};
use tapegate::systemd::stop_signals;
use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// `run` ended because the configured source cannot work here (no Bluetooth adapter,
/// BlueZ absent, D-Bus access denied, no replay file): restarting will not help, so the
/// unit names it in `RestartPreventExitStatus=`.
const EXIT_SOURCE_UNUSABLE: u8 = 3;

/// `run` refused a state database written by a newer tapegate (a downgrade): it is left
/// untouched, and restarting will not help (`RestartPreventExitStatus=`).
const EXIT_DATABASE_TOO_NEW: u8 = 6;

/// How a command failed.
enum Failure {
    Config(ConfigError),
    /// The command line or its input cannot be used as given.
    Usage(String),
    /// Our reader went away (`tapegate tapes | head`): end quietly.
    BrokenPipe,
    /// `run --until-drained` was stopped by a signal before it drained (logged).
    Undrained,
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let e = e.into();
        let broken_pipe = e.chain().any(|c| {
            c.downcast_ref::<CmdError>()
                .is_some_and(CmdError::is_broken_pipe)
                || c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        });
        if broken_pipe {
            return Failure::BrokenPipe;
        }
        match e.downcast::<CmdError>() {
            Ok(CmdError::Config(c)) => Failure::Config(c),
            Ok(CmdError::Usage(m)) => Failure::Usage(m),
            Ok(other) => Failure::Other(other.into()),
            Err(e) => Failure::Other(e),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) | Err(Failure::BrokenPipe) => ExitCode::SUCCESS,
        Err(Failure::Undrained) => ExitCode::from(EXIT_UNDRAINED),
        Err(Failure::Config(e)) => {
            report(&e.to_string());
            ExitCode::from(2)
        }
        Err(Failure::Usage(m)) => {
            let _ = writeln!(std::io::stderr(), "tapegate: {}", tapegate::text::inert(&m));
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            report(&error_text(&e));
            let run = e.downcast_ref::<RunError>();
            ExitCode::from(if run.is_some_and(RunError::source_cannot_work_here) {
                EXIT_SOURCE_UNUSABLE
            } else if run.is_some_and(RunError::state_not_writable) {
                EXIT_STATE_NOT_WRITABLE
            } else if run.is_some_and(RunError::database_too_new) {
                EXIT_DATABASE_TOO_NEW
            } else {
                1
            })
        }
    }
}

/// `e` and its causes, joined by `: `, each said once: a cause whose text the message
/// already holds (`outbox: file is not a database` over `file is not a database`) is
/// not repeated.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Says why the command failed on stderr. When stderr is the journal (a unit's
/// `JOURNAL_STREAM`), each line is marked priority 3 (`<3>`), so that the reason shows in
/// `journalctl -p warning` and `systemctl status`, not as an INFO line. A closed stderr
/// (`tapegate locate X 2>&1 | head -1`) is not an error of its own: nothing is said.
fn report(message: &str) {
    let mark = if stderr_is_journal() { "<3>" } else { "" };
    let mut stderr = std::io::stderr().lock();
    for line in message.lines() {
        // Errors quote text from elsewhere (the service, a CSV file, an argument):
        // shown inert, so that no escape sequence or bidi override acts.
        let line = tapegate::text::inert(line);
        if writeln!(stderr, "{mark}tapegate: {line}").is_err() {
            return;
        }
    }
}

/// Whether stderr is the stream systemd connected to the journal (`JOURNAL_STREAM` is
/// `DEVICE:INODE` of it; a process started from a service's shell inherits the variable
/// but not the stream).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    // fstat of the descriptor itself: a socket cannot be opened through /proc/self/fd.
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| std::fs::File::from(fd).metadata());
    let Ok(stderr) = stderr else {
        return false;
    };
    stream.to_string_lossy() == format!("{}:{}", stderr.dev(), stderr.ino())
}

/// The config with the service password: for what talks to the service.
fn load(cli: &Cli) -> Result<Config, Failure> {
    config::load(&cli.config, std::env::vars()).map_err(Failure::Config)
}

/// The config without reading the password: for what only reads the state database or
/// the radio, so that it works with the unit stopped and as any user who can read the
/// config.
fn load_local(cli: &Cli) -> Result<Config, Failure> {
    config::load_with(&cli.config, std::env::vars(), Password::Skip).map_err(Failure::Config)
}

/// Changes the log level of the running daemon (SIGHUP).
type LevelHandle = reload::Handle<EnvFilter, Registry>;

/// Logs to journald with structured fields when started by systemd (`JOURNAL_STREAM`),
/// otherwise human-readable to stderr. `RUST_LOG` wins over `level`.
fn init_logging(level: &str) -> LevelHandle {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let journald = std::env::var_os("JOURNAL_STREAM")
        .and_then(|_| tracing_journald::layer().ok())
        // Fields as they are named in the code (CORRELATION_ID, CAUSE, MAC, GATEWAY_ID),
        // without the default F_ prefix; none collides with journald's own. INFO is
        // informational (6) and DEBUG debug (7), as journalctl -p expects; the crate's
        // default makes INFO a notice (5).
        .map(|l| {
            l.with_syslog_identifier("tapegate".into())
                .with_field_prefix(None)
                .with_priority_mappings(PriorityMappings {
                    info: Priority::Informational,
                    debug: Priority::Debug,
                    ..PriorityMappings::new()
                })
        });
    match journald {
        Some(journald) => registry.with(journald).init(),
        None => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    // A closed stderr drops log lines; the default would panic
                    // reporting that it could not write them.
                    .log_internal_errors(false)
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_target(false),
            )
            .init(),
    }
    handle
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Applies a reloaded `log.level`, unless `RUST_LOG` decides.
fn level_setter(level: LevelHandle) -> SetLogLevel {
    Box::new(move |new| {
        if std::env::var_os("RUST_LOG").is_some() {
            return Ok(());
        }
        let filter = EnvFilter::try_new(new).map_err(|e| e.to_string())?;
        level.reload(filter).map_err(|e| e.to_string())
    })
}

fn dispatch(cli: Cli) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match &cli.command {
        Command::Run { until_drained } => {
            let config = load(&cli)?;
            let level = init_logging(&config.log.level);
            if let Some(warning) = config::world_readable_password(&cli.config) {
                tracing::warn!("{warning}");
            }
            let options = RunOptions {
                until_drained: *until_drained,
                reload: Some(Reload {
                    path: cli.config.clone(),
                    set_log_level: level_setter(level),
                }),
            };
            let rt = runtime()?;
            let result = rt.block_on(async move {
                let stop = stop_signals()?;
                anyhow::Ok(pipeline::run(config, stop, options).await?)
            });
            // Everything is committed by now. A blocking read of stdin (replay from
            // "-") cannot be interrupted; do not wait for it.
            rt.shutdown_background();
            if result?.stopped && *until_drained {
                return Err(Failure::Undrained);
            }
        }
        Command::Status { json } => {
            let config = load_local(&cli)?;
            tapegate::cmd::state::status(&config, *json, &mut stdout)?;
        }
        Command::DeadLetters(DeadLetters::List { json, limit }) => {
            let config = load_local(&cli)?;
            tapegate::cmd::state::dead_letters_list(&config, *json, *limit, &mut stdout)?;
        }
        Command::SupportBundle { output } => {
            tapegate::cmd::support_bundle::run(&cli.config, output.as_deref(), &mut stdout)?;
        }
        Command::Tapes { json, limit } => {
            let config = load_local(&cli)?;
            tapegate::cmd::state::tapes(&config, *json, *limit, &mut stdout)?;
        }
        Command::Check { config_only: true } => {
            let config = load_local(&cli)?;
            writeln!(
                stdout,
                "ok   config           {} is valid (gateway {}, {} product(s), source {:?}; the password is not read here, `tapegate check` reads it)",
                cli.config.display(),
                config.gateway.id,
                config.products.0.len(),
                config.scanner.source
            )?;
            if let Some(warning) = config
                .http
                .listen
                .and_then(tapegate::http::exposure_warning)
            {
                writeln!(stdout, "warn http             {warning}")?;
            }
        }
        Command::Check { config_only: false } => {
            let config = load(&cli)?;
            init_logging("error");
            let path = cli.config.display().to_string();
            if !runtime()?.block_on(tapegate::cmd::check::run(&config, &path, &mut stdout)) {
                return Err(Failure::Other(anyhow::anyhow!("check failed")));
            }
        }
        Command::Scan {
            record,
            duration,
            all,
        } => {
            let config = load_local(&cli)?;
            init_logging("warn");
            let options = tapegate::cmd::scan::ScanOptions {
                record: record.clone(),
                duration: duration
                    .map(|d| std::time::Duration::try_from_secs_f64(d.max(0.0)))
                    .transpose()?,
                all: *all,
            };
            let rt = runtime()?;
            let mut out = std::io::stdout();
            let result = rt.block_on(async {
                let stop = stop_signals()?;
                anyhow::Ok(tapegate::cmd::scan::run(&config, options, stop, &mut out).await?)
            });
            rt.shutdown_background();
            result?;
        }
        Command::Decode {
            mac,
            packet,
            product,
        } => {
            let config = load(&cli)?;
            init_logging("warn");
            let decoded = runtime()?.block_on(tapegate::cmd::decode::decode(
                &config,
                *mac,
                packet,
                product.as_deref(),
            ))?;
            writeln!(stdout, "{decoded}")?;
        }
        #[cfg(feature = "mock")]
        Command::Demo {
            duration,
            tapes,
            state_dir,
            http,
        } => {
            init_logging("warn");
            let options = tapegate::cmd::demo::DemoOptions {
                duration: duration.map(std::time::Duration::from_secs_f64),
                tapes: *tapes,
                state_dir: state_dir.clone(),
                http: *http,
            };
            let mut out = std::io::stdout();
            runtime()?.block_on(async {
                let stop = stop_signals()?;
                anyhow::Ok(tapegate::cmd::demo::run(options, stop, &mut out).await?)
            })?;
        }
        Command::SideChannel => {
            use tapegate::source::ble::mgmt::socket::{hand_to_systemd, Handed};
            let said = match hand_to_systemd() {
                Ok(Handed::Stored) => "the kernel's Bluetooth management socket is open for tapegate (the side channel)".to_string(),
                Ok(Handed::NoManager) => "not under systemd: no file descriptor store to hand the management socket to".to_string(),
                Err(e) => format!("no Bluetooth management socket here ({e}): tapegate reads adverts over D-Bus"),
            };
            writeln!(stdout, "{said}")?;
        }
        #[cfg(feature = "mock")]
        Command::Mock { listen } => {
            init_logging("info");
            runtime()?.block_on(tapegate::cmd::demo::mock(*listen))?;
        }
        Command::Device(device) => {
            let config = load(&cli)?;
            init_logging("warn");
            runtime()?.block_on(tapegate::cmd::device::run(&config, device, &mut stdout))?;
        }
        Command::Locate {
            asset_id,
            sensor,
            json,
        } => {
            let config = load(&cli)?;
            init_logging("warn");
            runtime()?.block_on(tapegate::cmd::locate::run(
                &config,
                asset_id,
                *sensor,
                *json,
                &mut stdout,
            ))?;
        }
        Command::History {
            qr,
            asset,
            event_type,
            from,
            to,
            json,
        } => {
            let config = load(&cli)?;
            init_logging("warn");
            let args = tapegate::cmd::history::HistoryArgs {
                qr: qr.as_deref(),
                asset: asset.as_deref(),
                event_type: event_type.as_deref(),
                from: from.as_deref(),
                to: to.as_deref(),
                json: *json,
            };
            runtime()?.block_on(tapegate::cmd::history::run(&config, args, &mut stdout))?;
        }
        Command::Message {
            message_type,
            file,
            json,
        } => {
            let config = load(&cli)?;
            init_logging("warn");
            runtime()?.block_on(tapegate::cmd::message::run(
                &config,
                *message_type,
                file,
                *json,
                &mut stdout,
            ))?;
        }
        Command::DeadLetters(DeadLetters::Retry(which)) => {
            let config = load_local(&cli)?;
            let n = tapegate::cmd::state::dead_letters_change(&config, true, which.mac)?;
            writeln!(stdout, "re-queued {n} dead letter(s)")?;
        }
        Command::DeadLetters(DeadLetters::Purge(which)) => {
            let config = load_local(&cli)?;
            let n = tapegate::cmd::state::dead_letters_change(&config, false, which.mac)?;
            writeln!(stdout, "purged {n} dead letter(s)")?;
        }
    }
    Ok(())
}
