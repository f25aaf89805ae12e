//! docs/configuration.md against the code (`on_permanent_error` and
//! `dead_letter_topic` were missing from the README's table). Every key the file takes
//! (read off the file's types by `settings::keys`) is on the page; every key the page's
//! tables name is one the file takes; every flag and variable of `walpost run` is there.
// Test crates: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::CommandFactory;

fn page() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The keys in the first column of the page's tables.
fn keys_on_the_page(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Keys of `[[outbox]]`'s router and `[messages.router]`: the page documents them once,
/// as `<section>.router.*` over `[router]`'s table.
fn covered_by_router(key: &str) -> Option<&str> {
    ["outbox.router.", "messages.router."].into_iter().find_map(|p| key.strip_prefix(p))
}

#[test]
fn every_key_of_the_file_is_on_the_page_and_nothing_else() {
    let text = page();
    let on_page = keys_on_the_page(&text);
    let in_code: BTreeSet<String> = walpost::settings::keys::file_keys().into_iter().collect();
    let missing: Vec<&String> = in_code
        .iter()
        .filter(|k| match covered_by_router(k) {
            Some(router_key) => !on_page.contains(&format!("router.{router_key}")),
            None => !on_page.contains(*k),
        })
        .collect();
    assert!(missing.is_empty(), "keys the code reads that docs/configuration.md does not list: {missing:?}");
    let unknown: Vec<&String> = on_page
        .iter()
        .filter(|k| !in_code.contains(*k) && !["outbox.router.*", "messages.router.*"].contains(&k.as_str()))
        .collect();
    assert!(unknown.is_empty(), "keys docs/configuration.md lists that the code does not read: {unknown:?}");
    assert!(in_code.len() > 60, "the walker found too few keys: {in_code:?}");
}

#[test]
fn every_flag_and_variable_of_run_is_on_the_page() {
    let text = page();
    let cli = walpost::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("walpost run");
    let mut missing = Vec::new();
    for arg in run.get_arguments().chain(cli.get_arguments()) {
        if let Some(long) = arg.get_long() {
            if !["help", "version"].contains(&long) && !text.contains(&format!("`--{long}")) {
                missing.push(format!("--{long}"));
            }
        }
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            if !text.contains(&format!("`{env}`")) {
                missing.push(env.into_owned());
            }
        }
    }
    assert!(missing.is_empty(), "flags or variables of walpost run missing from docs/configuration.md: {missing:?}");
}
