//! SQLSTATE codes used in the errors we send, as listed in PostgreSQL's `errcodes.txt`.

/// Class 08: connection_exception.
pub const CONNECTION_EXCEPTION: &str = "08000";
/// Class 08: sqlclient_unable_to_establish_sqlconnection.
pub const SQLCLIENT_UNABLE_TO_ESTABLISH: &str = "08001";
/// Class 08: connection_failure.
pub const CONNECTION_FAILURE: &str = "08006";
/// Class 08: protocol_violation.
pub const PROTOCOL_VIOLATION: &str = "08P01";
/// Class 0A: feature_not_supported.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
/// Class 22: character_not_in_repertoire (an invalid byte sequence for an encoding).
pub const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
/// Class 22: invalid_parameter_value.
pub const INVALID_PARAMETER_VALUE: &str = "22023";
/// Class 25: in_failed_sql_transaction.
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
/// Class 25: idle_in_transaction_session_timeout.
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "25P03";
/// Class 25: transaction_timeout.
pub const TRANSACTION_TIMEOUT: &str = "25P04";
/// Class 26: invalid_sql_statement_name (a prepared statement that does not exist).
pub const UNDEFINED_PSTATEMENT: &str = "26000";
/// A prepared statement of that name exists already.
pub const DUPLICATE_PSTATEMENT: &str = "42P05";
/// Class 28: invalid_authorization_specification.
pub const INVALID_AUTHORIZATION: &str = "28000";
/// Class 28: invalid_password.
pub const INVALID_PASSWORD: &str = "28P01";
/// Class 3D: invalid_catalog_name.
pub const INVALID_CATALOG_NAME: &str = "3D000";
/// Class 42: syntax_error.
pub const SYNTAX_ERROR: &str = "42601";
/// Class 42: insufficient_privilege.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// Class 42: undefined_object.
pub const UNDEFINED_OBJECT: &str = "42704";
/// Class 42: reserved_name.
pub const RESERVED_NAME: &str = "42939";
/// Class 53: insufficient_resources.
pub const INSUFFICIENT_RESOURCES: &str = "53000";
/// Class 53: too_many_connections.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// Class 54: program_limit_exceeded.
pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
/// Class 55: lock_not_available.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";
/// Class 57: query_canceled.
pub const QUERY_CANCELED: &str = "57014";
/// Class 57: admin_shutdown.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// Class 57: crash_shutdown.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// Class 57: cannot_connect_now.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// Class 57: idle_session_timeout.
pub const IDLE_SESSION_TIMEOUT: &str = "57P05";
/// Class F0: config_file_error.
pub const CONFIG_FILE_ERROR: &str = "F0000";
/// Class XX: internal_error.
pub const INTERNAL_ERROR: &str = "XX000";

#[cfg(test)]
mod tests {
    #[test]
    fn codes_are_five_uppercase_alphanumerics() {
        for c in [
            super::CONNECTION_EXCEPTION,
            super::PROTOCOL_VIOLATION,
            super::IDLE_SESSION_TIMEOUT,
            super::INTERNAL_ERROR,
        ] {
            assert_eq!(c.len(), 5);
            assert!(c
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()));
        }
    }
}
