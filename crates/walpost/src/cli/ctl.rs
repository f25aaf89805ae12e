//! `walpost ctl`'s flags: clap types, turned into an [`Action`] and [`Options`] of
//! [`crate::ops::ctl`], which does the asking.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand, ValueEnum};

use crate::ops::ctl::{Action, Options, Redrive, ReplayStart, Selection, TOKEN_ENV};

/// `walpost ctl`: see [`crate::cli::Command::Ctl`].
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The admin listener's base URL, http:// or https:// ([admin] addr of `walpost run`
    /// or `walpost inbox`), e.g. http://127.0.0.1:9188.
    #[arg(long = "admin", global = true, env = "WALPOST_ADMIN_URL", hide_env_values = true, value_name = "URL")]
    pub admin: Option<String>,

    /// A file holding the admin token alone (owner-only), instead of WALPOST_ADMIN_TOKEN.
    /// There is no flag for the token itself: a command line is readable by every user of
    /// the machine.
    #[arg(long, global = true, env = "WALPOST_ADMIN_TOKEN_FILE", hide_env_values = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// The CA certificate (PEM) an https:// listener's certificate is verified against,
    /// for a private CA [default: the system's roots].
    #[arg(long, global = true, env = "WALPOST_ADMIN_CA_FILE", hide_env_values = true, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,

    /// The longest the whole exchange may take, connecting included (e.g. 30s, 2min).
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s", value_parser = crate::settings::duration::parse_duration)]
    pub timeout: Duration,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// The token's name and role, to check a token (GET /api/v1/whoami).
    Whoami,
    /// `walpost run`'s state, slot, lag and alarms (GET /api/v1/status).
    Status,
    /// Stop reading from the slot, keeping it and the connection (POST /api/v1/pause).
    Pause,
    /// Read from the slot again (POST /api/v1/resume).
    Resume,
    /// The dead letters, newest first (GET /api/v1/dead-letters).
    DeadLetters {
        /// How many.
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// With their payloads (an operator's token, and [admin] show_payloads = true).
        #[arg(long)]
        payload: bool,
    },
    /// Send dead letters again through the current router and contracts
    /// (POST /api/v1/dead-letters/redrive).
    Redrive(RedriveArgs),
    /// Replays beside the stream (POST, GET, DELETE /api/v1/replays).
    Replay {
        #[command(subcommand)]
        action: ReplayCommand,
    },
    /// `walpost inbox`'s handlers and review queue (/api/v1/inbox/...).
    Inbox {
        #[command(subcommand)]
        action: InboxCommand,
    },
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["event_id", "reason"])))]
pub struct RedriveArgs {
    /// A dead letter's event id; repeatable.
    #[arg(long = "event-id", value_name = "ID")]
    pub event_id: Vec<String>,
    /// Every dead letter with this reason.
    #[arg(long, value_name = "REASON")]
    pub reason: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ReplayCommand {
    /// Start one beside the stream, as `walpost replay` with these flags would run;
    /// prints it with its id (POST /api/v1/replays).
    Start(ReplayStartArgs),
    /// The running replays and the last ones that ended (GET /api/v1/replays).
    List,
    /// A replay's progress (GET /api/v1/replays/ID).
    Show {
        /// The id `replay start` printed.
        id: String,
    },
    /// Stop a replay before its next fetch (DELETE /api/v1/replays/ID).
    Stop {
        /// The id `replay start` printed.
        id: String,
    },
}

/// At least one of --where, --since, --until, or --all: a start that selects nothing is
/// refused rather than taken for every row.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("rows").required(true).multiple(true).args(["condition", "since", "until", "all"])))]
pub struct ReplayStartArgs {
    /// A condition on the outbox rows, e.g. "aggregate_type = 'order'": columns compared
    /// with constants, as `walpost replay --where` takes it (--unsafe-where is not offered).
    #[arg(long = "where", value_name = "CONDITION")]
    pub condition: Option<String>,
    /// Rows whose time column is at or after this time (e.g. 2026-12-01T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Rows whose time column is before this time.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Every row of every outbox.
    #[arg(long, conflicts_with_all = ["condition", "since", "until"])]
    pub all: bool,
    /// The replay's id (the walpost.replay header) [default: replay-<UTC time>].
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// The column --since and --until apply to [default: the router's
    /// table.field.event.timestamp, else occurred_at].
    #[arg(long, value_name = "COLUMN")]
    pub time_column: Option<String>,
    /// Count the rows per topic; publish nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Consumer lag per partition, records stored (GET /api/v1/inbox/status).
    Status,
    /// Per handler: backlog, oldest pending, leased, review required, paused
    /// (GET /api/v1/inbox/handlers).
    Handlers,
    /// A handler's messages in review_required (GET /api/v1/inbox/handlers/NAME/review).
    Review {
        /// The handler's name (inbox.handlers).
        handler: String,
        /// One group per error code (count, first and last time, sample event ids).
        #[arg(long, value_enum, value_name = "error_code", conflicts_with = "error_code")]
        group_by: Option<GroupBy>,
        /// Only the messages with this error code.
        #[arg(long, value_name = "CODE")]
        error_code: Option<String>,
        /// How many messages (1-10000) [default: 100].
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Give messages in review_required to the handler again, like inbox.retry
    /// (POST /api/v1/inbox/handlers/NAME/retry); prints the count.
    Retry(SelectionArgs),
    /// Give up on messages in review_required, like inbox.dismiss
    /// (POST /api/v1/inbox/handlers/NAME/dismiss); prints the count.
    Dismiss(SelectionArgs),
    /// inbox.claim offers nothing to the handler until resumed
    /// (POST /api/v1/inbox/handlers/NAME/pause).
    Pause {
        /// The handler's name (inbox.handlers).
        handler: String,
    },
    /// inbox.claim offers the handler its messages again
    /// (POST /api/v1/inbox/handlers/NAME/resume).
    Resume {
        /// The handler's name (inbox.handlers).
        handler: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    #[value(name = "error_code")]
    ErrorCode,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["event_id", "error_code"])))]
pub struct SelectionArgs {
    /// The handler's name (inbox.handlers).
    pub handler: String,
    /// A message's event id; repeatable.
    #[arg(long = "event-id", value_name = "ID")]
    pub event_id: Vec<String>,
    /// Every message of the handler in review_required with this error code.
    #[arg(long, value_name = "CODE")]
    pub error_code: Option<String>,
}

impl SelectionArgs {
    fn selection(&self) -> Selection {
        match &self.error_code {
            Some(code) => Selection::ErrorCode(code.clone()),
            None => Selection::EventIds(self.event_id.clone()),
        }
    }
}

impl CtlArgs {
    /// How to ask: the flags, and the token variable from the environment.
    pub(crate) fn options(&self) -> Options {
        Options {
            url: self.admin.clone(),
            ca_file: self.ca_file.clone(),
            token_file: self.token_file.clone(),
            token_env: std::env::var_os(TOKEN_ENV),
            timeout: self.timeout,
        }
    }

    /// What to ask.
    pub(crate) fn action(&self) -> Action {
        match &self.command {
            CtlCommand::Whoami => Action::Whoami,
            CtlCommand::Status => Action::Status,
            CtlCommand::Pause => Action::Pause,
            CtlCommand::Resume => Action::Resume,
            CtlCommand::DeadLetters { limit, payload } => Action::DeadLetters { limit: *limit, payload: *payload },
            CtlCommand::Redrive(r) => Action::Redrive(match &r.reason {
                Some(reason) => Redrive::Reason(reason.clone()),
                None => Redrive::EventIds(r.event_id.clone()),
            }),
            CtlCommand::Replay { action } => match action {
                ReplayCommand::Start(s) => Action::ReplayStart(ReplayStart {
                    condition: s.condition.clone(),
                    since: s.since.clone(),
                    until: s.until.clone(),
                    id: s.id.clone(),
                    time_column: s.time_column.clone(),
                    dry_run: s.dry_run,
                    all: s.all,
                }),
                ReplayCommand::List => Action::ReplayList,
                ReplayCommand::Show { id } => Action::ReplayShow(id.clone()),
                ReplayCommand::Stop { id } => Action::ReplayStop(id.clone()),
            },
            CtlCommand::Inbox { action } => match action {
                InboxCommand::Status => Action::InboxStatus,
                InboxCommand::Handlers => Action::InboxHandlers,
                InboxCommand::Review { handler, group_by, error_code, limit } => Action::InboxReview {
                    handler: handler.clone(),
                    grouped: group_by.is_some(),
                    error_code: error_code.clone(),
                    limit: *limit,
                },
                InboxCommand::Retry(s) => Action::InboxRetry { handler: s.handler.clone(), selection: s.selection() },
                InboxCommand::Dismiss(s) => {
                    Action::InboxDismiss { handler: s.handler.clone(), selection: s.selection() }
                }
                InboxCommand::Pause { handler } => Action::InboxPause(handler.clone()),
                InboxCommand::Resume { handler } => Action::InboxResume(handler.clone()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parsed(argv: &[&str]) -> Result<CtlArgs, clap::Error> {
        let cli = Cli::try_parse_from([&["walpost", "ctl"], argv].concat())?;
        match cli.command {
            Command::Ctl(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commands_become_actions_and_flags_go_anywhere() {
        let a = parsed(&["inbox", "retry", "billing", "--error-code", "http_503", "--admin", "http://h:1"]).unwrap();
        assert_eq!(a.admin.as_deref(), Some("http://h:1"));
        assert_eq!(
            a.action(),
            Action::InboxRetry { handler: "billing".into(), selection: Selection::ErrorCode("http_503".into()) }
        );
        let a = parsed(&["--timeout", "5s", "redrive", "--event-id", "1", "--event-id", "2"]).unwrap();
        assert_eq!(a.timeout, Duration::from_secs(5));
        assert_eq!(a.action(), Action::Redrive(Redrive::EventIds(vec!["1".into(), "2".into()])));
        let a = parsed(&["replay", "start", "--until", "b", "--where", "x = 1", "--id", "fix-1"]).unwrap();
        let want = ReplayStart {
            until: Some("b".into()),
            condition: Some("x = 1".into()),
            id: Some("fix-1".into()),
            ..ReplayStart::default()
        };
        assert_eq!(a.action(), Action::ReplayStart(want));
        let a = parsed(&["replay", "start", "--all", "--dry-run"]).unwrap();
        assert_eq!(a.action(), Action::ReplayStart(ReplayStart { all: true, dry_run: true, ..ReplayStart::default() }));
        let a = parsed(&["inbox", "review", "h", "--group-by", "error_code"]).unwrap();
        assert_eq!(
            a.action(),
            Action::InboxReview { handler: "h".into(), grouped: true, error_code: None, limit: None }
        );
        assert_eq!(parsed(&["status"]).unwrap().timeout, Duration::from_secs(30));
    }

    #[test]
    fn a_token_flag_and_half_selections_are_usage_errors() {
        for argv in [
            &["--token", "s3cret", "status"][..],
            &["redrive"],
            &["redrive", "--event-id", "1", "--reason", "r"],
            &["replay", "start", "--id", "fix-1"],
            &["replay", "start", "--all", "--where", "x"],
            &["inbox", "dismiss", "h"],
            &["inbox", "review", "h", "--group-by", "error_code", "--error-code", "c"],
            &["inbox", "review", "h", "--group-by", "topic"],
        ] {
            let e = parsed(argv).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{argv:?}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
    }
}
