//! walpost's development tasks behind one entry point, `cargo xtask <task>` (the alias is
//! in .cargo/config.toml). Each task runs the script that defines it, so CI and a
//! developer run the same steps: `scripts/test.sh` (which `.ci/run` calls) stays the
//! one definition of the test steps, and this only names them.
//!
//! Standard library only: building it costs seconds, not minutes.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const HELP: &str = "\
cargo xtask <task> [arguments]: walpost's development tasks

  test                     the whole suite, as CI runs it (bash scripts/test.sh, ~40 min)
  test STEP...             some of its steps: suite (unit, property and end-to-end tests),
                           checks (alerting rules, the book, the supply chain), failover
                           (standby promotion, decoding on a standby, 3 Kafka brokers, on
                           PostgreSQL 17), majors (the end-to-end suite on PostgreSQL 14
                           and 18; WALPOST_TEST_MAJORS picks others)
  test -- ARGS             cargo test --workspace --locked --features walpost/failpoints ARGS
  matrix [MAJOR...] [-- ARGS]
                           the end-to-end suite once per PostgreSQL major (default 14 to 18;
                           bash scripts/test-matrix.sh)
  alerts                   the Prometheus alerting rules and their tests (scripts/check-alerts.sh)
  supply-chain             licences, sources and advisories of every dependency
  lint                     cargo fmt --check, then clippy on every target with -D warnings
  book                     build the book (docs/) and check every link (scripts/book.sh)
  bench [quick|full] [OPTIONS]
                           walpost against pg_recvlogical, Debezium and polling relays
                           (bash bench/run.sh; bench/README.md)
  bench ab-drain|tansu|inbox|inbox-sql|snapshot|retention-wal [ARGS]
                           one of the other benchmarks (bench/<name>.sh)
  demo                     the whole job end to end on this machine (scripts/demo.sh)
  help                     this text
";

/// The steps of scripts/test.sh, by the names its WALPOST_TEST_STEPS takes.
const TEST_STEPS: &[&str] = &["suite", "checks", "failover", "majors"];

/// The benchmarks other than bench/run.sh, each bench/<name>.sh.
const BENCHES: &[&str] = &["ab-drain", "tansu", "inbox", "inbox-sql", "snapshot", "retention-wal"];

/// What a task runs: a program with arguments, in the repository's root, with extra
/// environment variables. A task of several commands runs them in order, stopping at
/// the first that fails.
#[derive(Debug, PartialEq, Eq)]
struct Step {
    program: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
}

fn bash(script: &str, args: &[String]) -> Step {
    let mut all = vec![script.to_owned()];
    all.extend_from_slice(args);
    Step { program: "bash", args: all, env: Vec::new() }
}

fn cargo(args: &[&str]) -> Step {
    Step { program: "cargo", args: args.iter().map(|a| (*a).to_owned()).collect(), env: Vec::new() }
}

/// The commands of a task, or what is wrong with the command line.
fn plan(args: &[String]) -> Result<Vec<Step>, String> {
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => return Err("no task given".to_owned()),
    };
    let no_arguments = |steps: Vec<Step>| {
        if rest.is_empty() {
            Ok(steps)
        } else {
            Err(format!("`{task}` takes no arguments"))
        }
    };
    match task {
        "test" => match rest.first().map(String::as_str) {
            None => Ok(vec![bash("scripts/test.sh", &[])]),
            Some("--") => Ok(vec![bash("scripts/test.sh", &rest[1..])]),
            Some(_) => {
                if let Some(unknown) = rest.iter().find(|s| !TEST_STEPS.contains(&s.as_str())) {
                    return Err(format!("unknown test step `{unknown}` (steps: {})", TEST_STEPS.join(", ")));
                }
                let mut step = bash("scripts/test.sh", &[]);
                step.env.push(("WALPOST_TEST_STEPS", rest.join(" ")));
                Ok(vec![step])
            }
        },
        "matrix" => Ok(vec![bash("scripts/test-matrix.sh", rest)]),
        "alerts" => no_arguments(vec![bash("scripts/check-alerts.sh", &[])]),
        "supply-chain" => no_arguments(vec![bash("scripts/supply-chain.sh", &[])]),
        "lint" => no_arguments(vec![
            cargo(&["fmt", "--all", "--check"]),
            cargo(&[
                "clippy",
                "--locked",
                "--workspace",
                "--all-targets",
                "--features",
                "walpost/failpoints",
                "--",
                "-D",
                "warnings",
            ]),
        ]),
        "book" => no_arguments(vec![bash("scripts/book.sh", &[])]),
        "bench" => match rest.split_first() {
            Some((name, args)) if BENCHES.contains(&name.as_str()) => Ok(vec![bash(&format!("bench/{name}.sh"), args)]),
            _ => Ok(vec![bash("bench/run.sh", rest)]),
        },
        "demo" => Ok(vec![bash("scripts/demo.sh", rest)]),
        _ => Err(format!("unknown task `{task}`")),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), None | Some("help" | "--help" | "-h")) {
        print!("{HELP}");
        return if args.is_empty() { ExitCode::from(2) } else { ExitCode::SUCCESS };
    }
    let steps = match plan(&args) {
        Ok(steps) => steps,
        Err(e) => {
            eprintln!("xtask: {e}\n\n{HELP}");
            return ExitCode::from(2);
        }
    };
    for step in steps {
        let status = Command::new(step.program)
            .args(&step.args)
            .envs(step.env.iter().map(|(k, v)| (*k, v.as_str())))
            .current_dir(root())
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("xtask: `{} {}` failed ({s})", step.program, step.args.join(" "));
                return ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1).max(1));
            }
            Err(e) => {
                eprintln!("xtask: cannot run {}: {e}", step.program);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn test_runs_the_ci_script_whole_by_steps_or_with_cargo_arguments() {
        assert_eq!(plan(&args("test")), Ok(vec![bash("scripts/test.sh", &[])]));
        let steps = plan(&args("test suite majors")).expect("two steps");
        assert_eq!(steps[0].env, vec![("WALPOST_TEST_STEPS", "suite majors".to_owned())]);
        assert_eq!(plan(&args("test -- -p router")), Ok(vec![bash("scripts/test.sh", &args("-p router"))]));
        assert!(plan(&args("test e2e")).unwrap_err().contains("unknown test step `e2e`"));
    }

    #[test]
    fn bench_runs_run_sh_or_the_named_benchmark() {
        assert_eq!(plan(&args("bench full")), Ok(vec![bash("bench/run.sh", &args("full"))]));
        assert_eq!(plan(&args("bench ab-drain -r 2 recv")), Ok(vec![bash("bench/ab-drain.sh", &args("-r 2 recv"))]));
        assert!(plan(&args("book now")).is_err());
        assert!(plan(&args("deploy")).unwrap_err().contains("unknown task"));
    }

    /// Every script a task runs exists, and scripts/test.sh takes the steps named here:
    /// the steps are defined there once, and this list cannot drift from it.
    #[test]
    fn every_script_exists_and_test_sh_defines_the_same_steps() {
        let root = root();
        let mut scripts = vec!["scripts/test.sh", "scripts/test-matrix.sh", "scripts/check-alerts.sh"];
        scripts.extend(["scripts/supply-chain.sh", "scripts/book.sh", "scripts/demo.sh", "bench/run.sh"]);
        let benches: Vec<String> = BENCHES.iter().map(|b| format!("bench/{b}.sh")).collect();
        for script in scripts.iter().copied().chain(benches.iter().map(String::as_str)) {
            assert!(root.join(script).is_file(), "{script} does not exist");
        }
        let test_sh = std::fs::read_to_string(root.join("scripts/test.sh")).expect("scripts/test.sh");
        let defaults = format!("WALPOST_TEST_STEPS:-{}}}", TEST_STEPS.join(" "));
        assert!(test_sh.contains(&defaults), "scripts/test.sh's steps are not {TEST_STEPS:?}");
        for step in TEST_STEPS {
            assert!(test_sh.contains(&format!("if step {step}")), "scripts/test.sh runs no step {step}");
        }
    }
}
