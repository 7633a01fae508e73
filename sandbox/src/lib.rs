//! What a job (a parity test, a preflight, a warm runner's zygote) or an
//! agent starts with, so that the code fvd runs cannot reach fvd's
//! credentials:
//!
//! - [`env`](mod@env): the allow-list of fvd's own environment variables that reach
//!   it (nothing else of fvd's environment does);
//! - [`jail`]: the jail it starts in, through a launcher (`fvd __jail`, a
//!   fresh single-threaded process that sets the jail up and then execs the
//!   job): a mount namespace (a user namespace too when fvd is not root)
//!   in which fvd's token files and the host's block devices are covered,
//!   or, where namespaces are not allowed, a Landlock domain that cannot
//!   read them; in both, no capability that would bypass them
//!   (`CAP_SYS_PTRACE`, `CAP_SYS_ADMIN`, `CAP_SYS_RAWIO`, …) and
//!   `no_new_privs`;
//! - [`harden`]: what every fvd process does to itself first, so that a
//!   process of the same user without `CAP_SYS_PTRACE` (any jailed job)
//!   cannot read its `/proc/PID/environ`, `mem`, `maps` or `fd`.
//!
//! docs/internals.md "Containment" says why this mechanism, and
//! docs/fleet.md "Containment" what it does not cover.
//!
//! - Depends on no workspace crate.
//! - Nothing here logs a variable's value or reads a secret: it deals in
//!   names and paths.

pub mod env;
pub mod jail;
pub mod launch;

pub use jail::{Jail, JailError, Mechanism, Mode};

/// Makes this process non-dumpable: its `/proc/PID/{environ,mem,maps,fd,…}`
/// become readable only with `CAP_SYS_PTRACE`, and it writes no core dump
/// (which would hold its token). Its `cmdline` stays readable by everyone,
/// so fvd never carries a secret in its arguments (`--token-file PATH`
/// names a file the jail covers). Lost across `execve`, so children are
/// not affected.
pub fn harden() -> std::io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::from)
}
