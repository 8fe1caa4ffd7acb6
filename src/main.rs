//! The thin binary: parse the command line, load the config, start logging, call the
//! library, map errors to exit codes (0 ok, 2 bad config or usage, 1 anything else).

use std::process::ExitCode;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use tapegate::cli::{Cli, Command, DeadLetters};
use tapegate::config::{self, Config, ConfigError};
use tapegate::pipeline::{self, RunOptions};
use tokio::sync::watch;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// How a command failed.
enum Failure {
    Config(ConfigError),
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Other(e.into())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(e)) => {
            eprintln!("tapegate: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("tapegate: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn load(cli: &Cli) -> Result<Config, Failure> {
    config::load(&cli.config, std::env::vars()).map_err(Failure::Config)
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
        // without the default F_ prefix; none collides with journald's own.
        .map(|l| {
            l.with_syslog_identifier("tapegate".into())
                .with_field_prefix(None)
        });
    match journald {
        Some(journald) => registry.with(journald).init(),
        None => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
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

/// On SIGHUP: re-reads the config; a valid one replaces products, dedup settings and
/// the log level without dropping anything; a bad one is refused and the old one stays.
async fn reload_on_hangup(path: PathBuf, configs: watch::Sender<Arc<Config>>, level: LevelHandle) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        match config::load(&path, std::env::vars()) {
            Ok(new) => {
                if std::env::var_os("RUST_LOG").is_none() {
                    match EnvFilter::try_new(&new.log.level) {
                        Ok(f) => {
                            let _ = level.reload(f);
                        }
                        Err(e) => tracing::warn!(error = %e, "log level not changed"),
                    }
                }
                tracing::info!(path = %path.display(), "SIGHUP: config reloaded (products, dedup, log level; other changes take effect at the next start)");
                configs.send_replace(Arc::new(new));
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "SIGHUP: new config refused; the running one stays in force");
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

fn writeln_out(out: &mut dyn std::io::Write, text: &str) {
    let _ = writeln!(out, "{text}");
}

fn dispatch(cli: Cli) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match &cli.command {
        Command::Run { until_drained } => {
            let config = load(&cli)?;
            let level = init_logging(&config.log.level);
            let (reload_tx, reload_rx) = tokio::sync::watch::channel(Arc::new(config.clone()));
            let options = RunOptions {
                until_drained: *until_drained,
                reload: Some(reload_rx),
            };
            let rt = runtime()?;
            let path = cli.config.clone();
            let result = rt.block_on(async move {
                tokio::spawn(reload_on_hangup(path, reload_tx, level));
                pipeline::run(config, stop_signal(), options).await
            });
            // Everything is committed by now. A blocking read of stdin (replay from
            // "-") cannot be interrupted; do not wait for it.
            rt.shutdown_background();
            result?;
        }
        Command::Status { json } => {
            let config = load(&cli)?;
            tapegate::cmd::state::status(&config, *json, &mut stdout)?;
        }
        Command::DeadLetters(DeadLetters::List { json, limit }) => {
            let config = load(&cli)?;
            tapegate::cmd::state::dead_letters_list(&config, *json, *limit, &mut stdout)?;
        }
        Command::Tapes { json, limit } => {
            let config = load(&cli)?;
            tapegate::cmd::state::tapes(&config, *json, *limit, &mut stdout)?;
        }
        Command::Check { config_only: true } => {
            let config = load(&cli)?;
            println!(
                "ok   config           {} is valid (gateway {}, {} product(s), source {:?})",
                cli.config.display(),
                config.gateway.id,
                config.products.0.len(),
                config.scanner.source
            );
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
            let config = load(&cli)?;
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
            let result = rt.block_on(tapegate::cmd::scan::run(
                &config,
                options,
                stop_signal(),
                &mut out,
            ));
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
            let decoded = runtime()?.block_on(tapegate::cmd::state::decode(
                &config,
                *mac,
                packet,
                product.as_deref(),
            ))?;
            writeln_out(&mut stdout, &decoded);
        }
        #[cfg(feature = "mock")]
        Command::Demo {
            duration,
            tapes,
            state_dir,
        } => {
            init_logging("warn");
            let options = tapegate::cmd::demo::DemoOptions {
                duration: duration.map(std::time::Duration::from_secs_f64),
                tapes: *tapes,
                state_dir: state_dir.clone(),
            };
            let rt = runtime()?;
            let mut out = std::io::stdout();
            rt.block_on(tapegate::cmd::demo::run(options, stop_signal(), &mut out))?;
        }
        #[cfg(feature = "mock")]
        Command::Mock { listen } => {
            init_logging("info");
            runtime()?.block_on(tapegate::mock::serve_forever(
                *listen,
                tapegate::mock::MockConfig::demo(),
            ))?;
        }
        Command::DeadLetters(DeadLetters::Retry(which)) => {
            let config = load(&cli)?;
            let n = tapegate::cmd::state::dead_letters_change(&config, true, which.mac)?;
            println!("re-queued {n} dead letter(s)");
        }
        Command::DeadLetters(DeadLetters::Purge(which)) => {
            let config = load(&cli)?;
            let n = tapegate::cmd::state::dead_letters_change(&config, false, which.mac)?;
            println!("purged {n} dead letter(s)");
        }
    }
    Ok(())
}
