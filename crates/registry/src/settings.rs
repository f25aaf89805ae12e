//! `[registry]`, resolved (by the binary's settings, from the file, flags and
//! variables): where the schemas are, how walpost authenticates, how long it waits.

use std::path::PathBuf;
use std::time::Duration;

use contracts::registry::RegistryOptions;

/// How walpost authenticates to the registry. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    None,
    Basic { username: String, password: String },
    Bearer(String),
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::None => f.write_str("None"),
            RegistryAuth::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
            RegistryAuth::Bearer(_) => f.write_str("Bearer(***)"),
        }
    }
}

/// `[registry]`, resolved: where the schemas are and how records are written.
#[derive(Debug, Clone)]
pub struct RegistrySettings {
    /// `http(s)://host:port/path`: the API's base (Apicurio's is `.../apis/ccompat/v7`).
    pub url: String,
    pub options: RegistryOptions,
    pub ca: Option<PathBuf>,
    pub auth: RegistryAuth,
    pub timeout: Duration,
    /// The longest answer body read; a longer one is an error.
    pub max_response_bytes: usize,
}
