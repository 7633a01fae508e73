//! `fvd`: the command-line entry point. Parses arguments, sets up logging
//! and delegates each subcommand to its module under `cmd/`; exit codes are
//! decided there.

mod cmd;

/// The build day of `--version`, tested here (`build.rs` uses it).
#[cfg(test)]
#[path = "../build/date.rs"]
mod build_date;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `fvd __jail …`: this process is a job's launcher (fvd_sandbox::jail);
    // it sets the jail up and execs the job, single-threaded, before
    // anything else runs.
    fvd_sandbox::launch::main_if_jail();
    // Nothing of this process's environment or memory (its token) is
    // readable through /proc by a process without CAP_SYS_PTRACE.
    let hardened = fvd_sandbox::harden();
    let cli = cmd::Cli::parse();
    cmd::JSON_LOGS.store(
        cli.log_format == cmd::LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    if let Err(e) = hardened {
        cmd::say(
            cmd::Said::Warning,
            &format!("cannot make this process non-dumpable: {e}"),
        );
    }
    // Logs go to stderr so stdout stays machine-readable (`--json`); spans
    // and metrics leave over OTLP only when an endpoint is configured.
    let color = cli.color_enabled();
    cmd::COLOR.store(color, std::sync::atomic::Ordering::Relaxed);
    let mut telemetry = match fvd_telemetry::init_with(
        cli.otlp_endpoint.as_deref(),
        cli.service_name(),
        fvd_telemetry::LogConfig {
            env: "FVD_LOG",
            default_filter: cli.default_log_filter(),
            format: cli.log_format.into(),
            ansi: color,
        },
    ) {
        Ok(t) => t,
        Err(err) => {
            cmd::say(cmd::Said::Error, &err.to_string());
            return ExitCode::from(cmd::exit::Exit::Usage);
        }
    };
    let code = match cmd::run(cli) {
        Ok(exit) => ExitCode::from(exit),
        // A script tells an unreachable orchestrator (5) and a refused
        // credential (6) from a usage error (2), each with one line.
        Err(err) => match err.downcast_ref::<cmd::exit::Remote>() {
            Some(remote) => {
                cmd::say(cmd::Said::Error, &remote.to_string());
                ExitCode::from(remote.exit())
            }
            None => {
                cmd::say(cmd::Said::Error, &format!("{err:#}"));
                ExitCode::from(cmd::exit::Exit::Usage)
            }
        },
    };
    // The command's runtime is gone: flushing may block here.
    telemetry.shutdown();
    code
}

#[cfg(test)]
mod tests {
    use super::build_date::utc_day;

    #[test]
    fn the_build_day_is_the_utc_calendar_day_of_the_epoch_seconds() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(86_399), "1970-01-01");
        assert_eq!(utc_day(86_400), "1970-01-02");
        // 2000-02-29 (a leap day of a century year) and the day after.
        assert_eq!(utc_day(951_782_400), "2000-02-29");
        assert_eq!(utc_day(951_868_800), "2000-03-01");
        // 2026-11-27T23:59:59Z is still that day in UTC.
        assert_eq!(utc_day(1_795_823_999), "2026-11-27");
        assert_eq!(utc_day(-1), "1969-12-31");
    }
}
