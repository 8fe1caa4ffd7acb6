//! The thin binary: parse the command line, load the config, start logging, call the
//! library, map errors to exit codes (0 ok, 2 bad config or usage, 1 anything else).

use std::process::ExitCode;

use clap::Parser;
use tapegate::cli::{Cli, Command, DeadLetters};
use tapegate::config::{self, Config, ConfigError};
use tapegate::pipeline::{self, RunOptions};

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

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
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
            init_logging(&config.log.level);
            let options = RunOptions {
                until_drained: *until_drained,
                ..RunOptions::default()
            };
            let rt = runtime()?;
            let result = rt.block_on(pipeline::run(config, stop_signal(), options));
            // Everything is committed by now. A blocking read of stdin (replay from
            // "-") cannot be interrupted; do not wait for it.
            rt.shutdown_background();
            result?;
        }
        Command::Status { json } => {
            let config = load(&cli)?;
            tapegate::commands::status(&config, *json, &mut stdout)?;
        }
        Command::DeadLetters(DeadLetters::List { json, limit }) => {
            let config = load(&cli)?;
            tapegate::commands::dead_letters_list(&config, *json, *limit, &mut stdout)?;
        }
        Command::Tapes { json, limit } => {
            let config = load(&cli)?;
            tapegate::commands::tapes(&config, *json, *limit, &mut stdout)?;
        }
        Command::Check => {
            let config = load(&cli)?;
            init_logging("error");
            let path = cli.config.display().to_string();
            if !runtime()?.block_on(tapegate::check::run(&config, &path, &mut stdout)) {
                return Err(Failure::Other(anyhow::anyhow!("check failed")));
            }
        }
        Command::Decode {
            mac,
            packet,
            product,
        } => {
            let config = load(&cli)?;
            init_logging("warn");
            let decoded = runtime()?.block_on(tapegate::commands::decode(
                &config,
                *mac,
                packet,
                product.as_deref(),
            ))?;
            writeln_out(&mut stdout, &decoded);
        }
        Command::Demo {
            duration,
            tapes,
            state_dir,
        } => {
            init_logging("warn");
            let options = tapegate::demo::DemoOptions {
                duration: duration.map(std::time::Duration::from_secs_f64),
                tapes: *tapes,
                state_dir: state_dir.clone(),
            };
            let rt = runtime()?;
            let mut out = std::io::stdout();
            rt.block_on(tapegate::demo::run(options, stop_signal(), &mut out))?;
        }
        Command::Mock { listen } => {
            init_logging("info");
            runtime()?.block_on(tapegate::mock::serve_forever(
                *listen,
                tapegate::mock::MockConfig::demo(),
            ))?;
        }
        Command::DeadLetters(DeadLetters::Retry(which)) => {
            let config = load(&cli)?;
            let n = tapegate::commands::dead_letters_change(&config, true, which.mac)?;
            println!("re-queued {n} dead letter(s)");
        }
        Command::DeadLetters(DeadLetters::Purge(which)) => {
            let config = load(&cli)?;
            let n = tapegate::commands::dead_letters_change(&config, false, which.mac)?;
            println!("purged {n} dead letter(s)");
        }
    }
    Ok(())
}
