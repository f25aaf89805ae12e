//! Secrets in configuration: where they may come from besides argv, and the rule that a
//! file holding one is readable by its owner only.
//!
//! - The PostgreSQL password: the connection string, `--postgres-password-file` /
//!   `WALPOST_POSTGRES_PASSWORD_FILE` / file key `postgres_password_file` (it wins over
//!   `PGPASSWORD`), `PGPASSWORD`, or the password file (`PGPASSFILE`, `~/.pgpass`).
//! - Kafka secret properties ([`KAFKA_SECRET_PROPERTIES`]): `[kafka.properties]`, a
//!   properties file (`[kafka] properties_file`, `key=value` lines), or one environment
//!   variable each (`WALPOST_KAFKA_SASL_PASSWORD` for `sasl.password`: see
//!   [`kafka_secret_env_var`]).
//! - A configuration file, properties file or password file that holds a secret and is
//!   readable by group or others is refused, with the `chmod` that fixes it.
//!
//! Nothing here puts a secret's value in an error text.

use std::collections::BTreeMap;
use std::path::Path;

use super::ConfigError;

/// librdkafka properties whose values are secrets.
pub const KAFKA_SECRET_PROPERTIES: &[&str] =
    &["sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem"];

/// The warning for a PostgreSQL password in the `--postgres` flag.
pub const POSTGRES_PASSWORD_ON_ARGV: &str = "the PostgreSQL password was given in --postgres, on the command line, where other users of this machine can read it (/proc/<pid>/cmdline): put it in a password file (--postgres-password-file, WALPOST_POSTGRES_PASSWORD_FILE or PGPASSFILE) or pass the URL in WALPOST_POSTGRES instead";

/// The warning for a PostgreSQL password in the `--postgres-primary` flag (decoding on a
/// standby: where walpost writes).
pub const POSTGRES_PRIMARY_PASSWORD_ON_ARGV: &str = "the PostgreSQL password was given in --postgres-primary, on the command line, where other users of this machine can read it (/proc/<pid>/cmdline): put it in a password file (--postgres-password-file, WALPOST_POSTGRES_PASSWORD_FILE or PGPASSFILE) or pass the URL in WALPOST_POSTGRES_PRIMARY instead";

/// `WALPOST_KAFKA_SASL_PASSWORD` for `sasl.password`.
pub fn kafka_secret_env_var(property: &str) -> String {
    format!("WALPOST_KAFKA_{}", property.to_ascii_uppercase().replace('.', "_"))
}

/// Whether any of `properties` is a secret.
pub fn has_kafka_secret<'a>(mut properties: impl Iterator<Item = &'a String>) -> Option<&'a str> {
    properties.find(|k| KAFKA_SECRET_PROPERTIES.contains(&k.as_str())).map(String::as_str)
}

/// Refuses a file holding `what` (a secret) that group or others can read.
#[cfg(unix)]
pub fn require_private(path: &Path, what: &str) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::Insecure {
            path: path.display().to_string(),
            what: what.to_owned(),
            mode: format!("{mode:04o}"),
        });
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn require_private(_path: &Path, _what: &str) -> Result<(), ConfigError> {
    Ok(())
}

/// Reads a file that holds one secret (a password): owner-only, trailing newline dropped.
pub fn read_secret_file(path: &Path, what: &str) -> Result<String, ConfigError> {
    require_private(path, what)?;
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

/// Reads a librdkafka properties file: `key=value` lines, `#` comments and blank lines
/// ignored. Owner-only when it holds a secret property.
pub fn read_properties_file(path: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    let mut out = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(ConfigError::Parse {
                path: path.display().to_string(),
                message: format!("line {} is not key=value", number + 1),
            });
        };
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    if let Some(secret) = has_kafka_secret(out.keys()) {
        require_private(path, secret)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn file(name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("walpost-secrets-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn secret_files_must_be_private_and_errors_never_show_the_secret() {
        let open = file("pw-open", "hunter2-canary\n", 0o644);
        let err = read_secret_file(&open, "the PostgreSQL password").unwrap_err().to_string();
        assert!(err.contains("chmod 600") && err.contains("0644"), "{err}");
        assert!(!err.contains("hunter2-canary"), "{err}");
        let private = file("pw-private", "hunter2-canary\n", 0o600);
        assert_eq!(read_secret_file(&private, "the PostgreSQL password").unwrap(), "hunter2-canary");
        let _ = std::fs::remove_file(open);
        let _ = std::fs::remove_file(private);
    }

    #[test]
    fn properties_files_with_secrets_must_be_private() {
        let open = file("props-open", "# kafka\nsecurity.protocol=SASL_SSL\nsasl.password = canary-pw\n", 0o640);
        let err = read_properties_file(&open).unwrap_err().to_string();
        assert!(err.contains("sasl.password") && err.contains("chmod 600"), "{err}");
        assert!(!err.contains("canary-pw"), "{err}");
        let plain = file("props-plain", "compression.type=zstd\n", 0o644);
        assert_eq!(read_properties_file(&plain).unwrap()["compression.type"], "zstd");
        let _ = std::fs::remove_file(open);
        let _ = std::fs::remove_file(plain);
    }

    #[test]
    fn env_var_names_follow_the_property() {
        assert_eq!(kafka_secret_env_var("sasl.password"), "WALPOST_KAFKA_SASL_PASSWORD");
        assert_eq!(kafka_secret_env_var("ssl.key.pem"), "WALPOST_KAFKA_SSL_KEY_PEM");
    }
}
