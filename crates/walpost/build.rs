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
    // HEAD names a branch whose ref file changes on every commit: watch both (only
    // paths that exist, or cargo would rerun this script on every build).
    let git = std::path::Path::new("../../.git");
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            if git.join(reference).exists() {
                println!("cargo:rerun-if-changed=../../.git/{reference}");
            }
        }
    }
    if git.join("packed-refs").exists() {
        println!("cargo:rerun-if-changed=../../.git/packed-refs");
    }
}
