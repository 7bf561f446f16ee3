//! What a `postgres://` URL asks of capgate beyond what sqlx reads: whether a connection pooler
//! lends server sessions one transaction at a time (`pooler=transaction`), and which kind of
//! server will do (`target_session_attrs=`).
//!
//! sqlx drops a parameter it does not know with a warning, and cannot parse libpq's list of
//! hosts (`h1:5432,h2:5432`, "invalid port number"). Both mattered: a dropped
//! `target_session_attrs=read-write` let capgate start on a standby and then fail every write.
//! So capgate reads these parameters itself, hands sqlx the rest, and refuses what it does not
//! support with a message that names the fix (docs/decisions/0033-behind-a-pooler-and-a-failover.md).

use std::fmt;

/// How the connections reach PostgreSQL's sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Each connection is one server session for as long as it is open: PostgreSQL itself, or a
    /// pooler in session mode. The default.
    Session,
    /// A pooler lends a server session for one transaction at a time (PgBouncer's
    /// `pool_mode = transaction`): nothing may outlive a transaction — no prepared statement,
    /// no `SET`, no session advisory lock, no `LISTEN` (`pooler=transaction`).
    Transaction,
}

/// Which server a connection may settle on (`target_session_attrs`, as libpq names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    /// Whatever answers.
    Any,
    /// One that takes writes: `transaction_read_only` is off.
    ReadWrite,
    /// One that is not in recovery (not a standby).
    Primary,
}

impl SessionAttrs {
    /// The parameter's value, as the URL gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::Primary => "primary",
        }
    }
}

/// A `postgres://` URL taken apart: what capgate reads, and the URL sqlx is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    /// The URL without the parameters below, for `PgConnectOptions::from_str`.
    pub for_sqlx: String,
    pub pooling: Pooling,
    pub session_attrs: SessionAttrs,
}

/// A URL capgate will not connect with, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlProblem {
    /// libpq's list of hosts (in the authority or in `host=`).
    SeveralHosts { hosts: String },
    /// A `target_session_attrs` capgate does not honour.
    SessionAttrs { value: String },
    /// A `pooler` that is neither `session` nor `transaction`.
    Pooler { value: String },
}

impl fmt::Display for UrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlProblem::SeveralHosts { hosts } => write!(
                f,
                "the URL names several hosts (`{hosts}`), and capgate connects to one address: put \
                 one address in front of the cluster that always reaches its primary (HAProxy \
                 with Patroni's REST health check, deploy/ha/, or a DNS name your failover \
                 moves), and keep `target_session_attrs=read-write` so that a connection landing \
                 on a standby is refused"
            ),
            UrlProblem::SessionAttrs { value } => write!(
                f,
                "`target_session_attrs={value}` is not supported: capgate writes, so it takes \
                 `read-write`, `primary` or `any`"
            ),
            UrlProblem::Pooler { value } => write!(
                f,
                "`pooler={value}` is not a pooling mode: `pooler=transaction` when a pooler lends \
                 server connections per transaction (PgBouncer's `pool_mode = transaction`), \
                 `pooler=session` (the default) otherwise"
            ),
        }
    }
}

/// Reads `url`'s `pooler` and `target_session_attrs` parameters and checks that it names one
/// host. The parameters' values are compared as given (they need no escaping).
pub fn parse(url: &str) -> Result<PostgresUrl, UrlProblem> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |end| end + 3);
    let authority = &base[authority_start..];
    // The hosts follow the userinfo's last `@` (a password may hold `@`), up to the path.
    let hosts_start = authority.rfind('@').map_or(0, |at| at + 1);
    let hosts = authority[hosts_start..].split('/').next().unwrap_or_default();
    if hosts.contains(',') {
        return Err(UrlProblem::SeveralHosts {
            hosts: hosts.to_owned(),
        });
    }
    let mut pooling = Pooling::Session;
    let mut session_attrs = SessionAttrs::Any;
    let mut kept = Vec::new();
    for pair in query.into_iter().flat_map(|query| query.split('&')) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "pooler" => {
                pooling = match value {
                    "session" => Pooling::Session,
                    "transaction" => Pooling::Transaction,
                    _ => {
                        return Err(UrlProblem::Pooler {
                            value: value.to_owned(),
                        })
                    }
                }
            }
            "target_session_attrs" => {
                session_attrs = match value {
                    "any" => SessionAttrs::Any,
                    "read-write" => SessionAttrs::ReadWrite,
                    "primary" => SessionAttrs::Primary,
                    _ => {
                        return Err(UrlProblem::SessionAttrs {
                            value: value.to_owned(),
                        })
                    }
                }
            }
            "host" if value.contains(',') || value.contains("%2C") || value.contains("%2c") => {
                return Err(UrlProblem::SeveralHosts {
                    hosts: value.to_owned(),
                })
            }
            _ => kept.push(pair),
        }
    }
    let for_sqlx = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(PostgresUrl {
        for_sqlx,
        pooling,
        session_attrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> PostgresUrl {
        parse(url).unwrap_or_else(|problem| panic!("{url}: {problem}"))
    }

    #[test]
    fn a_plain_url_is_left_as_it_is() {
        let url = parsed("postgres://capgate:pw@db:5432/capgate?application_name=a");
        assert_eq!(
            url.for_sqlx,
            "postgres://capgate:pw@db:5432/capgate?application_name=a"
        );
        assert_eq!(url.pooling, Pooling::Session);
        assert_eq!(url.session_attrs, SessionAttrs::Any);
    }

    #[test]
    fn capgates_parameters_are_read_and_taken_out() {
        let url =
            parsed("postgres://u@db/x?pooler=transaction&application_name=a&target_session_attrs=read-write");
        assert_eq!(url.for_sqlx, "postgres://u@db/x?application_name=a");
        assert_eq!(url.pooling, Pooling::Transaction);
        assert_eq!(url.session_attrs, SessionAttrs::ReadWrite);
        let url = parsed("postgres://u@db/x?target_session_attrs=primary&pooler=session");
        assert_eq!(url.for_sqlx, "postgres://u@db/x");
        assert_eq!(url.pooling, Pooling::Session);
        assert_eq!(url.session_attrs, SessionAttrs::Primary);
    }

    #[test]
    fn several_hosts_are_refused_with_the_topology_that_works() {
        for url in [
            "postgres://u:pw@h1:5432,h2:5432/db?target_session_attrs=read-write",
            "postgres://h1,h2/db",
            "postgres:///db?host=h1,h2",
        ] {
            let problem = parse(url).expect_err(url);
            assert!(matches!(problem, UrlProblem::SeveralHosts { .. }), "{url}");
            let message = problem.to_string();
            assert!(
                message.contains("HAProxy") && message.contains("read-write"),
                "{message}"
            );
        }
        // A comma in a password or in another parameter is not a list of hosts.
        parsed("postgres://u:p,w@db/x?application_name=a,b");
    }

    #[test]
    fn unknown_values_are_refused_not_dropped() {
        assert_eq!(
            parse("postgres://db/x?target_session_attrs=standby"),
            Err(UrlProblem::SessionAttrs {
                value: "standby".to_owned()
            })
        );
        assert_eq!(
            parse("postgres://db/x?pooler=statement"),
            Err(UrlProblem::Pooler {
                value: "statement".to_owned()
            })
        );
    }
}
