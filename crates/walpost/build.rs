//! Records the git commit for `walpost --version`.
use std::process::Command;

fn main() {
    let commit = std::env::var("WALPOST_GIT_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    });
    println!("cargo:rustc-env=WALPOST_GIT_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
    println!("cargo:rerun-if-env-changed=WALPOST_GIT_COMMIT");
    println!("cargo:rerun-if-changed=../../.git/HEAD");
}
