//! The thin binary: parse the command line, load the config, start logging, call the
//! library, map errors to exit codes (0 ok, 2 bad config or usage, 1 anything else; the
//! daemon's own stops with the sysexits numbers of `tapegate::pipeline`: 69 the
//! configured source cannot work on this machine, 73 this user cannot write the state,
//! 65 the state database is newer than this tapegate, 75 `run --until-drained` stopped
//! before it drained).

use std::io::Write;
use std::process::ExitCode;

use std::path::Path;

use clap::Parser;
use tapegate::clock::SharedClock;
use tapegate::cmd::cli::{Cli, Command, DeadLetters, Operator};
use tapegate::cmd::{
    self, block_on, check, dead_letters, decode, device, history, locate, message, scan, status,
    tapes,
};
use tapegate::cmd::{side_channel, support_bundle, CmdError};
use tapegate::config::{self, Config, ConfigError, Password};
use tapegate::pipeline::{
    Reload, RunError, RunOptions, SetLogLevel, EXIT_DATABASE_TOO_NEW, EXIT_SOURCE_UNUSABLE,
    EXIT_STATE_NOT_WRITABLE, EXIT_UNDRAINED,
};
use tapegate::util::debug_hooks::DebugHooks;
use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

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
    match dispatch(&cli) {
        Ok(()) | Err(Failure::BrokenPipe) => ExitCode::SUCCESS,
        Err(Failure::Undrained) => ExitCode::from(EXIT_UNDRAINED),
        Err(Failure::Config(e)) => {
            report(&e.to_string());
            ExitCode::from(2)
        }
        Err(Failure::Usage(m)) => {
            let _ = writeln!(
                std::io::stderr(),
                "tapegate: {}",
                tapegate::util::text::inert(&m)
            );
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
        let line = tapegate::util::text::inert(line);
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

/// The clock every command reads, made once: the machine's, or in a debug build the test
/// clock a test names in `TAPEGATE_FAKE_CLOCK` (a release build has no test clock).
fn the_clock() -> SharedClock {
    #[cfg(debug_assertions)]
    if let Some(test_clock) = tapegate::clock::fake::from_env() {
        return test_clock;
    }
    tapegate::clock::system()
}

/// What a test asks of a debug build, made once from the environment; a release build
/// reads no test variable and has none.
fn the_hooks() -> DebugHooks {
    #[cfg(any(debug_assertions, feature = "test-hooks"))]
    return DebugHooks::from_env();
    #[cfg(not(any(debug_assertions, feature = "test-hooks")))]
    DebugHooks::default()
}

/// One arm a command, each calling into `tapegate::cmd`; what the arm loads first says
/// what the command needs: the config with the password ([`service`]), without it
/// ([`local`]), and logging at which level.
fn dispatch(cli: &Cli) -> Result<(), Failure> {
    let path = cli.config.as_path();
    let clock = &the_clock();
    let out = &mut std::io::stdout().lock();
    match &cli.command {
        Command::Run { until_drained } => daemon(path, clock, the_hooks(), *until_drained),
        Command::Status { json } => Ok(status::status(&local(path)?, &**clock, *json, out)?),
        Command::Tapes { json, limit } => {
            Ok(tapes::tapes(&local(path)?, &**clock, *json, *limit, out)?)
        }
        Command::DeadLetters(DeadLetters::List { json, limit }) => {
            Ok(dead_letters::list(&local(path)?, *json, *limit, out)?)
        }
        Command::DeadLetters(DeadLetters::Retry(which)) => Ok(writeln!(
            out,
            "re-queued {} dead letter(s)",
            dead_letters::change(&local(path)?, true, which.mac)?
        )?),
        Command::DeadLetters(DeadLetters::Purge(which)) => Ok(writeln!(
            out,
            "purged {} dead letter(s)",
            dead_letters::change(&local(path)?, false, which.mac)?
        )?),
        Command::SupportBundle { output } => {
            Ok(support_bundle::run(path, &**clock, output.as_deref(), out).map(drop)?)
        }
        Command::Check { config_only: true } => Ok(check::config_only(path, &local(path)?, out)?),
        Command::Check { config_only: false } => Ok(block_on(check::command(
            &service(path, "error")?,
            clock,
            path,
            out,
        ))??),
        Command::Scan {
            record,
            duration,
            all,
        } => Ok(scan::watch(
            &logged(local(path)?, "warn"),
            clock,
            scan::ScanOptions {
                hooks: the_hooks(),
                ..scan::ScanOptions::new(record.clone(), *duration, *all)?
            },
        )
        .map(drop)?),
        Command::Decode {
            mac,
            packet,
            product,
        } => Ok(writeln!(
            out,
            "{}",
            block_on(decode::decode(
                &service(path, "warn")?,
                clock,
                *mac,
                packet,
                product.as_deref()
            ))??
        )?),
        #[cfg(feature = "mock")]
        Command::Demo {
            duration,
            tapes,
            state_dir,
            http,
        } => demo(tapegate::cmd::demo::DemoOptions {
            duration: duration.map(std::time::Duration::from_secs_f64),
            tapes: *tapes,
            state_dir: state_dir.clone(),
            http: *http,
            clock: clock.clone(),
        }),
        Command::SideChannel => Ok(side_channel::run(out)?),
        #[cfg(feature = "mock")]
        Command::Mock { listen, record } => mock(*listen, record.as_deref()),
        Command::Operator(op) => operator(path, clock, op, out),
    }
}

/// The operator's commands: the config with the password, logging at WARN.
fn operator(
    path: &Path,
    clock: &SharedClock,
    op: &Operator,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let config = &service(path, "warn")?;
    match op {
        Operator::Device(d) => Ok(block_on(device::run(config, clock, d, out))??),
        Operator::Locate {
            asset_id,
            sensor,
            json,
        } => Ok(block_on(locate::run(
            config, clock, asset_id, *sensor, *json, out,
        ))??),
        Operator::History {
            qr,
            asset,
            event_type,
            from,
            to,
            json,
        } => Ok(block_on(history::run(
            config,
            clock,
            history::HistoryArgs {
                qr: qr.as_deref(),
                asset: asset.as_deref(),
                event_type: event_type.as_deref(),
                from: from.as_deref(),
                to: to.as_deref(),
                json: *json,
            },
            out,
        ))??),
        Operator::Message {
            message_type,
            file,
            json,
        } => Ok(block_on(message::run(
            config,
            clock,
            *message_type,
            file,
            *json,
            out,
        ))??),
    }
}

/// `tapegate run`: the daemon, logging at `log.level` (which a reload may change).
fn daemon(
    path: &Path,
    clock: &SharedClock,
    hooks: DebugHooks,
    until_drained: bool,
) -> Result<(), Failure> {
    let config = load(path)?;
    let level = init_logging(&config.log.level);
    let options = RunOptions {
        until_drained,
        reload: Some(Reload {
            path: path.to_path_buf(),
            set_log_level: level_setter(level),
        }),
        clock: clock.clone(),
        mgmt_socket: tapegate::source::ble::mgmt::socket::from_systemd(),
        hooks,
    };
    let report = cmd::run::run(config, path, options)??;
    if report.stopped && until_drained {
        return Err(Failure::Undrained);
    }
    Ok(())
}

/// `tapegate demo`: the mock service, the daemon and the status page in one process.
#[cfg(feature = "mock")]
fn demo(options: tapegate::cmd::demo::DemoOptions) -> Result<(), Failure> {
    init_logging("warn");
    let mut out = std::io::stdout();
    block_on(async {
        let stop = tapegate::util::systemd::stop_signals()?;
        anyhow::Ok(tapegate::cmd::demo::run(options, stop, &mut out).await?)
    })??;
    Ok(())
}

/// `tapegate mock`: the mock service alone.
#[cfg(feature = "mock")]
fn mock(listen: std::net::SocketAddr, record: Option<&Path>) -> Result<(), Failure> {
    init_logging("info");
    block_on(tapegate::cmd::demo::mock(listen, record))??;
    Ok(())
}

/// The config with the service password, then logging at `level`: for what talks to the
/// service.
fn service(path: &Path, level: &str) -> Result<Config, Failure> {
    Ok(logged(load(path)?, level))
}

fn load(path: &Path) -> Result<Config, Failure> {
    config::load(path, std::env::vars()).map_err(Failure::Config)
}

/// The config without reading the password: for what only reads the state database or
/// the radio, so that it works with the unit stopped and as any user who can read the
/// config.
fn local(path: &Path) -> Result<Config, Failure> {
    config::load_with(path, std::env::vars(), Password::Skip).map_err(Failure::Config)
}

/// `config`, once logging at `level` has started.
fn logged(config: Config, level: &str) -> Config {
    init_logging(level);
    config
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
