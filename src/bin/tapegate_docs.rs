//! `tapegate-docs DIR`: the man pages and the shell completions of `tapegate`, written
//! from the command line's own definition (`tapegate::cmd::cli`) into `DIR`, for the package
//! (scripts/build-deb.sh runs it before `cargo deb`, whose assets take them from
//! there): `man/tapegate.1.gz` and a page per command (`tapegate-run.1.gz`...),
//! `completions/tapegate.bash`, `_tapegate` (zsh) and `tapegate.fish`. Not in the
//! package's binary (the `docs` feature).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: tapegate-docs DIR");
        return ExitCode::from(2);
    };
    match write_all(Path::new(&dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tapegate-docs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(dir: &Path) -> std::io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let cli = tapegate::cmd::cli::Cli::command();
    pages(&cli, "", &man)?;
    for (shell, name) in [
        (Shell::Bash, "tapegate.bash"),
        (Shell::Zsh, "_tapegate"),
        (Shell::Fish, "tapegate.fish"),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cli.clone(), "tapegate", &mut out);
        std::fs::write(completions.join(name), out)?;
    }
    Ok(())
}

/// The page of `cmd` (named after its parents, `tapegate-device-add`) and of each of its
/// commands, gzipped as Debian's man pages are.
fn pages(cmd: &clap::Command, parents: &str, dir: &Path) -> std::io::Result<()> {
    let name = if parents.is_empty() {
        cmd.get_name().to_string()
    } else {
        format!("{parents}-{}", cmd.get_name())
    };
    // clap names a command with a static string; this process writes a few pages and ends.
    let page = cmd.clone().name(&*Box::leak(name.clone().into_boxed_str()));
    let mut roff = Vec::new();
    clap_mangen::Man::new(page).render(&mut roff)?;
    // No timestamp in the archive, so that the same definition gives the same bytes.
    let file = std::fs::File::create(dir.join(format!("{name}.1.gz")))?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(file, flate2::Compression::best());
    gz.write_all(&roff)?;
    gz.finish()?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, &name, dir)?;
    }
    Ok(())
}
