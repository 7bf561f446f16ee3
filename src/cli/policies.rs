//! `capgate policies list|show|diff|history|activate|shadow`: the stored versions, one of them as
//! published, the effective diff of two, who changed the active one and when, rolling back
//! (or forward) to one of them, and a shadow version (`shadow.rs`) — all through the server
//! (`--server URL`, an admin token) but the shadow's report, read from the store.
//! `activate` prints the effective diff it caused; `diff` compiles both stored revisions here and
//! reports as `capgate diff` does.

mod shadow;

use std::fmt::Write as _;

use capgate_core::policy::load_catalog;
use tonic::transport::Channel;

use crate::wire::convert;
use crate::wire::proto::policy_service_client::PolicyServiceClient;
use crate::wire::proto::{
    ActivatePolicyRequest, ActivatePolicyResponse, GetPolicyVersionRequest, GetPolicyVersionResponse,
    ListPolicyActivationsRequest, ListPolicyVersionsRequest, PolicyActivation, PolicyVersion,
};

use super::diff::{self, FailOn};
use super::input::{Loaded, Source};
use super::remote::{conflict_or_failure, runtime, status_failure, Connection, Server};
use super::{publish, Exit, Failure, Outcome};
use crate::clock;

/// The most a stored version's answer holds: an artifact and a catalog at their limits (8 MiB
/// each, as a publish is bounded), and room for the rest. A default client takes 4 MiB.
const MAX_VERSION_ANSWER: usize = 2 * 8 * 1024 * 1024 + 64 * 1024;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// The stored versions, newest first; `*` marks the active one.
    List {
        /// At most this many.
        #[arg(long, value_name = "N", default_value_t = 20)]
        limit: u32,
        /// Print a JSON array of versions.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Print a stored revision's artifact as it was published (byte for byte: its SHA-256 is
    /// the version).
    Show {
        /// The stored revision.
        #[arg(value_name = "REV")]
        revision: u64,
        /// Print the catalog published with it instead.
        #[arg(long)]
        catalog: bool,
        /// Print one JSON document: the version's metadata, its artifact and catalog.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Show which decisions change from one stored revision to another (as `capgate diff`).
    Diff {
        /// The earlier revision.
        #[arg(value_name = "BEFORE")]
        before: u64,
        /// The later revision.
        #[arg(value_name = "AFTER")]
        after: u64,
        /// Which changes make the exit code 1.
        #[arg(long, value_enum, value_name = "WHICH", default_value_t = FailOn::Any)]
        fail_on: FailOn,
        /// Print the JSON document instead of the human report.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Who changed the active version, when, and from which revision to which, newest first.
    History {
        /// At most this many.
        #[arg(long, value_name = "N", default_value_t = 20)]
        limit: u32,
        /// Print a JSON array of activations.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// Make a stored revision active again (a rollback).
    Activate {
        /// The revision to activate.
        #[arg(value_name = "REV")]
        revision: u64,
        /// Only if this is still the active revision.
        #[arg(long, value_name = "N")]
        expected_revision: Option<u64>,
        /// Print the outcome as one JSON document.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: Server,
    },
    /// A version evaluated beside the active one on live traffic, never changing an answer:
    /// set, clear, show it, and report where it decided otherwise.
    Shadow(shadow::Args),
}

pub fn run(args: &Args) -> Result<Outcome, Failure> {
    match &args.command {
        Command::List { limit, json, server } => list(*limit, *json, server),
        Command::Show {
            revision,
            catalog,
            json,
            server,
        } => show(*revision, *catalog, *json, server),
        Command::Diff {
            before,
            after,
            fail_on,
            json,
            server,
        } => compare(*before, *after, *fail_on, *json, server),
        Command::History { limit, json, server } => history(*limit, *json, server),
        Command::Activate {
            revision,
            expected_revision,
            json,
            server,
        } => activate(*revision, *expected_revision, *json, server),
        Command::Shadow(args) => shadow::run(args),
    }
}

fn list(limit: u32, as_json: bool, server: &Server) -> Result<Outcome, Failure> {
    let versions = runtime()?.block_on(async {
        let connection = server.connect().await?;
        let mut client = PolicyServiceClient::new(connection.channel.clone());
        client
            .list_policy_versions(connection.request(ListPolicyVersionsRequest { limit }))
            .await
            .map(|response| response.into_inner().versions)
            .map_err(|status| status_failure(&status))
    })?;
    if as_json {
        let versions: Vec<serde_json::Value> = versions.iter().map(version_json).collect();
        return Ok(Outcome::stdout(
            super::to_json(&serde_json::Value::Array(versions)),
            Exit::Done,
        ));
    }
    let mut out = String::new();
    if versions.is_empty() {
        let _ = writeln!(out, "no policy version is stored");
    }
    for version in &versions {
        let PolicyVersion {
            revision,
            version,
            author,
            comment,
            created_at,
            active,
            shadow,
        } = version;
        let created = created_at
            .as_ref()
            .map_or_else(String::new, |at| clock::format(convert::millis(at)));
        // `*` the active version, `s` the shadow one.
        let mark = match (*active, *shadow) {
            (true, _) => "*",
            (false, true) => "s",
            (false, false) => " ",
        };
        let line = format!("{mark} {revision:>5}  {created:24}  {version}  {author}  {comment}");
        let _ = writeln!(out, "{}", line.trim_end());
    }
    Ok(Outcome::stdout(out, Exit::Done))
}

/// The version's metadata as `list --json` prints it.
fn version_json(version: &PolicyVersion) -> serde_json::Value {
    let PolicyVersion {
        revision,
        version,
        author,
        comment,
        created_at,
        active,
        shadow,
    } = version;
    serde_json::json!({
        "revision": revision,
        "version": version,
        "active": active,
        "shadow": shadow,
        "author": author,
        "comment": comment,
        "created_at": created_at.as_ref().map(|at| clock::format(convert::millis(at))),
    })
}

fn client(connection: &Connection) -> PolicyServiceClient<Channel> {
    PolicyServiceClient::new(connection.channel.clone()).max_decoding_message_size(MAX_VERSION_ANSWER)
}

/// A stored revision, with its text.
async fn stored(connection: &Connection, revision: u64) -> Result<GetPolicyVersionResponse, Failure> {
    client(connection)
        .get_policy_version(connection.request(GetPolicyVersionRequest { revision }))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| status_failure(&status))
}

fn show(revision: u64, catalog: bool, as_json: bool, server: &Server) -> Result<Outcome, Failure> {
    let answer = runtime()?.block_on(async {
        let connection = server.connect().await?;
        stored(&connection, revision).await
    })?;
    let GetPolicyVersionResponse {
        version,
        artifact,
        catalog: catalog_text,
    } = answer;
    if as_json {
        let mut document = version.as_ref().map(version_json).unwrap_or_default();
        document["artifact"] = serde_json::Value::from(artifact);
        document["catalog"] = catalog_text.map_or(serde_json::Value::Null, serde_json::Value::from);
        return Ok(Outcome::stdout(super::to_json(&document), Exit::Done));
    }
    // As stored, not one byte added: `policies show 3 > policy.yaml` is the published file.
    if catalog {
        return catalog_text
            .map(|text| Outcome::stdout(text, Exit::Done))
            .ok_or_else(|| Failure::Input(format!("revision {revision} was published without a catalog")));
    }
    Ok(Outcome::stdout(artifact, Exit::Done))
}

/// Both revisions from the server, compiled here (each with its own catalog) and compared as
/// `capgate diff` compares files.
fn compare(
    before: u64,
    after: u64,
    fail_on: FailOn,
    as_json: bool,
    server: &Server,
) -> Result<Outcome, Failure> {
    let (earlier, later) = runtime()?.block_on(async {
        let connection = server.connect().await?;
        Ok::<_, Failure>((
            stored(&connection, before).await?,
            stored(&connection, after).await?,
        ))
    })?;
    let earlier = compiled(before, earlier)?;
    let later = compiled(after, later)?;
    Ok(diff::compare(&earlier, &later, as_json, fail_on))
}

fn compiled(revision: u64, stored: GetPolicyVersionResponse) -> Result<Loaded, Failure> {
    let GetPolicyVersionResponse {
        version: _,
        artifact,
        catalog,
    } = stored;
    let catalog = catalog
        .map(|text| {
            load_catalog(text.as_bytes()).map_err(|error| {
                Failure::Input(format!("cannot use the catalog of revision {revision}: {error}"))
            })
        })
        .transpose()?;
    let source = Source {
        origin: format!("revision {revision}"),
        bytes: artifact.into_bytes(),
    };
    Ok(Loaded::compile(source, catalog.as_ref()))
}

fn history(limit: u32, as_json: bool, server: &Server) -> Result<Outcome, Failure> {
    let activations = runtime()?.block_on(async {
        let connection = server.connect().await?;
        client(&connection)
            .list_policy_activations(connection.request(ListPolicyActivationsRequest { limit }))
            .await
            .map(|response| response.into_inner().activations)
            .map_err(|status| status_failure(&status))
    })?;
    let at = |activation: &PolicyActivation| {
        activation
            .at
            .as_ref()
            .map_or_else(String::new, |at| clock::format(convert::millis(at)))
    };
    if as_json {
        let activations: Vec<serde_json::Value> = activations
            .iter()
            .map(|activation| {
                serde_json::json!({
                    "at": at(activation),
                    "actor": activation.actor,
                    "kind": activation.kind,
                    "from_revision": activation.from_revision,
                    "to_revision": activation.to_revision,
                })
            })
            .collect();
        return Ok(Outcome::stdout(
            super::to_json(&serde_json::Value::Array(activations)),
            Exit::Done,
        ));
    }
    let mut out = String::new();
    if activations.is_empty() {
        let _ = writeln!(out, "no version was ever activated");
    }
    for activation in &activations {
        let PolicyActivation {
            at: _,
            actor,
            kind,
            from_revision,
            to_revision,
        } = activation;
        let from = from_revision.map_or_else(|| "-".to_owned(), |revision| revision.to_string());
        let _ = writeln!(
            out,
            "{:24}  {kind:8}  {from:>5} → {to_revision:<5}  by {actor}",
            at(activation)
        );
    }
    Ok(Outcome::stdout(out, Exit::Done))
}

/// A compare-and-set conflict exits 1, as `publish`'s does: the request was understood and
/// refused, which is a finding, not an input that could not be used.
fn activate(
    revision: u64,
    expected: Option<u64>,
    as_json: bool,
    server: &Server,
) -> Result<Outcome, Failure> {
    let answer = runtime()?.block_on(async {
        let connection = server.connect().await.map_err(Err)?;
        let mut client = PolicyServiceClient::new(connection.channel.clone());
        client
            .activate_policy(connection.request(ActivatePolicyRequest {
                revision,
                expected_active_revision: expected,
            }))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| conflict_or_failure(&status))
    });
    let response = match answer {
        Ok(response) => response,
        Err(refused) => return refused,
    };
    let ActivatePolicyResponse { version, changes } = response;
    if as_json {
        let document = serde_json::json!({
            "revision": revision,
            "version": version.as_ref().map(|version| version.version.clone()),
            "changes": changes
                .iter()
                .filter_map(convert::change_from)
                .map(|change| super::diff::change_json(&change))
                .collect::<Vec<_>>(),
        });
        return Ok(Outcome::stdout(super::to_json(&document), Exit::Done));
    }
    let mut out = String::new();
    let label = version.as_ref().map_or("", |version| version.version.as_str());
    let _ = writeln!(out, "activated: revision {revision} ({label}) is active\n");
    out.push_str(&publish::render_changes(&changes));
    Ok(Outcome::stdout(out, Exit::Done))
}
