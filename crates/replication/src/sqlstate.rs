//! The SQLSTATE codes walpost acts on, by the names PostgreSQL's documentation gives them
//! (Appendix A, "PostgreSQL Error Codes"), and the classes it acts on by their first
//! two characters. A server error's code is compared with these, never with a literal.

/// Class 08: connection exception.
pub const CLASS_CONNECTION_EXCEPTION: &str = "08";
/// Class 28: invalid authorization specification.
pub const CLASS_INVALID_AUTHORIZATION: &str = "28";
/// Class 53: insufficient resources (too many connections, out of memory, disk full).
pub const CLASS_INSUFFICIENT_RESOURCES: &str = "53";
/// Class 57P: operator intervention (admin shutdown, crash shutdown, cannot connect now).
pub const CLASS_OPERATOR_INTERVENTION: &str = "57P";

/// 23505 unique_violation.
pub const UNIQUE_VIOLATION: &str = "23505";
/// 23514 check_violation.
pub const CHECK_VIOLATION: &str = "23514";
/// 28000 invalid_authorization_specification (pg_hba.conf has no line, among others).
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
/// 28P01 invalid_password.
pub const INVALID_PASSWORD: &str = "28P01";
/// 3D000 invalid_catalog_name (the database does not exist).
pub const INVALID_CATALOG_NAME: &str = "3D000";
/// 40001 serialization_failure.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// 40P01 deadlock_detected.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// 42501 insufficient_privilege.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// 42P01 undefined_table.
pub const UNDEFINED_TABLE: &str = "42P01";
/// 42703 undefined_column.
pub const UNDEFINED_COLUMN: &str = "42703";
/// 42883 undefined_function.
pub const UNDEFINED_FUNCTION: &str = "42883";
/// 42P07 duplicate_table.
pub const DUPLICATE_TABLE: &str = "42P07";
/// 42P17 invalid_object_definition.
pub const INVALID_OBJECT_DEFINITION: &str = "42P17";
/// 55006 object_in_use (a replication slot held by another process).
pub const OBJECT_IN_USE: &str = "55006";
/// 55P03 lock_not_available (`lock_timeout` ran out).
pub const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Whether `code` is of `class` (a class constant of this module).
pub fn in_class(code: &str, class: &str) -> bool {
    code.starts_with(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_classes_have_their_documented_shape() {
        for code in [
            UNIQUE_VIOLATION,
            CHECK_VIOLATION,
            INVALID_AUTHORIZATION_SPECIFICATION,
            INVALID_PASSWORD,
            INVALID_CATALOG_NAME,
            SERIALIZATION_FAILURE,
            DEADLOCK_DETECTED,
            INSUFFICIENT_PRIVILEGE,
            DUPLICATE_TABLE,
            UNDEFINED_TABLE,
            UNDEFINED_COLUMN,
            UNDEFINED_FUNCTION,
            INVALID_OBJECT_DEFINITION,
            OBJECT_IN_USE,
            LOCK_NOT_AVAILABLE,
        ] {
            assert!(code.len() == 5 && code.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()), "{code}");
        }
        assert!(in_class(INVALID_PASSWORD, CLASS_INVALID_AUTHORIZATION));
        assert!(in_class("57P01", CLASS_OPERATOR_INTERVENTION) && !in_class("57014", CLASS_OPERATOR_INTERVENTION));
    }
}
