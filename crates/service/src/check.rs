//! One result of `walpost check` or `walpost check inbox`: printed as one line, and a
//! failed one makes the command exit 1.

/// A check's outcome and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Ok(String),
    Warn(String),
    Fail(String),
}

impl Check {
    /// The line printed for it (`ok`, `warn` or `FAIL`, then the text).
    pub fn line(&self) -> String {
        match self {
            Check::Ok(m) => format!("ok    {m}"),
            Check::Warn(m) => format!("warn  {m}"),
            Check::Fail(m) => format!("FAIL  {m}"),
        }
    }
}

/// Whether any check failed (the command then exits 1).
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| matches!(c, Check::Fail(_)))
}
