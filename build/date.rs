//! The build date of `fvd --version`: a Unix time as a UTC calendar day,
//! without a date library (the build script has no dependencies). Shared
//! by `build.rs` and the binary's unit tests.

/// `secs` since 1970-01-01T00:00:00Z as `YYYY-MM-DD` (UTC), by Howard
/// Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
pub fn utc_day(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
