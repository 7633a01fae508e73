//! The jail's launcher for this crate's own tests (`fvd __jail` is the
//! launcher of real workers and orchestrators): `fvd-jail __jail run PLAN
//! -- PROGRAM ARGS…`.

fn main() {
    fvd_sandbox::launch::main_if_jail();
    eprintln!("usage: fvd-jail __jail run PLAN -- PROGRAM ARGS… | fvd-jail __jail probe PLAN");
    std::process::exit(2);
}
