//! `fvd`: the command-line entry point. Parses arguments, sets up logging
//! and delegates each subcommand to its module under `cmd/`; exit codes are
//! decided there.

mod cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `fvd __jail …`: this process is a job's launcher (fvd_sandbox::jail);
    // it sets the jail up and execs the job, single-threaded, before
    // anything else runs.
    fvd_sandbox::launch::main_if_jail();
    // Nothing of this process's environment or memory (its token) is
    // readable through /proc by a process without CAP_SYS_PTRACE.
    if let Err(e) = fvd_sandbox::harden() {
        eprintln!("fvd: warning: cannot make this process non-dumpable: {e}");
    }
    let cli = cmd::Cli::parse();
    // Logs go to stderr so stdout stays machine-readable (`--json`); spans
    // and metrics leave over OTLP only when an endpoint is configured.
    let mut telemetry =
        match fvd_telemetry::init(cli.otlp_endpoint.as_deref(), cli.service_name(), "FVD_LOG") {
            Ok(t) => t,
            Err(err) => {
                eprintln!("fvd: error: {err}");
                return ExitCode::from(cmd::exit::Exit::Usage);
            }
        };
    let code = match cmd::run(cli) {
        Ok(exit) => ExitCode::from(exit),
        Err(err) => {
            eprintln!("fvd: error: {err:#}");
            ExitCode::from(cmd::exit::Exit::Usage)
        }
    };
    // The command's runtime is gone: flushing may block here.
    telemetry.shutdown();
    code
}
