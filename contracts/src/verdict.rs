//! Parity verdicts classified from pytest's JUnit XML, never from exit codes.
