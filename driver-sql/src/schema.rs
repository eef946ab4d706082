//! The lock table's schema version.

use lockcore::LockError;

/// The version of the lock table layout this crate writes. A table stamped with a newer
/// version was created by a newer distlock and is refused rather than misused.
pub const SCHEMA_VERSION: i64 = 1;

/// Refuses a table stamped by a newer version of the driver.
pub(crate) fn check_version(table: &str, version: i64) -> Result<(), LockError> {
    if version > SCHEMA_VERSION {
        return Err(LockError::config(format!(
            "lock table {table} has schema version {version}, newer than this driver's \
             {SCHEMA_VERSION}: upgrade distlock or use another table"
        )));
    }
    Ok(())
}
