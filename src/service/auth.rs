//! Who may call the service (docs/service.md): bearer tokens in the
//! `authorization` metadata, compared in constant time, and two roles.
//!
//! | call | gateway token | asserting gateway token | admin token |
//! |---|---|---|---|
//! | `Decide`, `ListVisible` with a credential | yes | yes | yes |
//! | `Decide`, `ListVisible` asserting a principal | no (`PERMISSION_DENIED`) | yes | yes |
//! | `Decide`, `ListVisible` forwarding `credential.client_certificate` | no (`PERMISSION_DENIED`) | yes | yes |
//! | every `PolicyService` call | no (`PERMISSION_DENIED`) | no | yes |
//!
//! A gateway that may assert any principal can become anyone, so asserting
//! is a separate grant (`--asserting-gateway-token`). An admin may assert:
//! it can publish any policy anyway. A forwarded client certificate is the
//! same power in other words: the service never sees the TLS handshake, so
//! a gateway that forwards a DN of its choosing becomes that `mtls`
//! principal. Only the TLS terminator can vouch for a certificate, and it
//! needs the asserting grant (docs/decisions/0016-forwarded-certificates.md).
//!
//! Reading the policy is admin-only too: the artifact is the whole
//! authorisation map, and a gateway only needs the decisions.
//!
//! With no token configured the server only listens on loopback (checked at
//! start-up) and every caller is `loopback`, with every role.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;
use tonic::Status;

use super::config::Token;
use super::pipeline::Refusal;

/// The identity recorded for callers when no token is configured.
pub const LOOPBACK: &str = "loopback";

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Decisions and listings: a gateway or an admin.
    Gateway,
    /// Policy versions: an admin.
    Admin,
}

/// An authenticated gateway (or admin): the token's name and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    pub name: String,
    pub admin: bool,
    /// Whether it may assert a principal instead of forwarding a credential.
    pub may_assert: bool,
}

impl Gateway {
    /// Refuses an asserted principal from a caller not trusted to assert.
    pub fn check_may_assert(&self) -> Result<(), Refusal> {
        if self.may_assert {
            Ok(())
        } else {
            Err(Refusal::PermissionDenied(format!(
                "`{}` may not assert a principal: forward the caller's `credential`, \
                 or configure the token with `--asserting-gateway-token`",
                self.name
            )))
        }
    }

    /// Refuses a forwarded client certificate from a caller not trusted to assert: anyone can
    /// write a DN into a request, only the TLS terminator that checked the certificate can vouch
    /// for it.
    pub fn check_may_forward_certificate(&self) -> Result<(), Refusal> {
        if self.may_assert {
            Ok(())
        } else {
            Err(Refusal::PermissionDenied(format!(
                "`{}` may not forward `credential.client_certificate`: only the TLS terminator that \
                 verified the certificate can vouch for it, and it needs a token configured with \
                 `--asserting-gateway-token`; otherwise forward the caller's bearer token or API key",
                self.name
            )))
        }
    }
}

/// The configured tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    gateway: Vec<Token>,
    asserting: Vec<Token>,
    admin: Vec<Token>,
}

/// What a token is for.
#[derive(Clone, Copy)]
enum Kind {
    Gateway,
    Asserting,
    Admin,
}

impl Tokens {
    pub fn new(gateway: Vec<Token>, asserting: Vec<Token>, admin: Vec<Token>) -> Self {
        Tokens {
            gateway,
            asserting,
            admin,
        }
    }

    fn open(&self) -> bool {
        self.gateway.is_empty() && self.asserting.is_empty() && self.admin.is_empty()
    }

    /// Checks the call's bearer token for `role`. Messages never repeat what
    /// was presented.
    pub fn authorize(&self, metadata: &MetadataMap, role: Role) -> Result<Gateway, Status> {
        self.check(
            metadata.get("authorization").map(|value| value.as_bytes()),
            "metadata",
            role,
        )
    }

    /// As [`Tokens::authorize`], for an HTTP door: the same token in the `authorization` header.
    pub fn authorize_http(
        &self,
        headers: &tonic::codegen::http::HeaderMap,
        role: Role,
    ) -> Result<Gateway, Status> {
        self.check(
            headers.get("authorization").map(|value| value.as_bytes()),
            "header",
            role,
        )
    }

    /// As [`Tokens::authorize_http`], with the token in a header of its own (`name`, lower-case),
    /// bare or as `Bearer <token>`: the forward-auth door, whose `authorization` is the caller's.
    pub fn authorize_header(
        &self,
        headers: &tonic::codegen::http::HeaderMap,
        name: &str,
        role: Role,
    ) -> Result<Gateway, Status> {
        let value = headers.get(name).map(|value| value.as_bytes());
        if value.is_none() && !self.open() {
            return Err(Status::unauthenticated(format!(
                "missing the `{name}` header with the gateway's token"
            )));
        }
        let bearer = value.map(|value| {
            if value.starts_with(b"Bearer ") || value.starts_with(b"bearer ") {
                value.to_vec()
            } else {
                [b"Bearer ".as_slice(), value].concat()
            }
        });
        self.check(bearer.as_deref(), "header", role)
    }

    /// Checks the `authorization` value, from metadata or a header (`carrier`, for messages).
    fn check(&self, authorization: Option<&[u8]>, carrier: &str, role: Role) -> Result<Gateway, Status> {
        if self.open() {
            return Ok(Gateway {
                name: LOOPBACK.to_owned(),
                admin: true,
                may_assert: true,
            });
        }
        let Some(value) = authorization else {
            return Err(Status::unauthenticated(format!(
                "missing `authorization: Bearer <token>` {carrier}"
            )));
        };
        let presented = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .ok_or_else(|| {
                Status::unauthenticated(format!("the `authorization` {carrier} is not a bearer token"))
            })?;
        let digest: [u8; 32] = Sha256::digest(presented).into();
        // Every token is compared, whatever matched, so the time taken says
        // nothing about which one (or whether any) did.
        let mut found: Option<Gateway> = None;
        let all = (self.admin.iter().map(|token| (token, Kind::Admin)))
            .chain(self.asserting.iter().map(|token| (token, Kind::Asserting)))
            .chain(self.gateway.iter().map(|token| (token, Kind::Gateway)));
        for (token, kind) in all {
            let matches: bool = token.digest.ct_eq(&digest).into();
            if matches && found.is_none() {
                found = Some(Gateway {
                    name: token.name.clone(),
                    admin: matches!(kind, Kind::Admin),
                    may_assert: matches!(kind, Kind::Admin | Kind::Asserting),
                });
            }
        }
        let caller = found.ok_or_else(|| Status::unauthenticated("the bearer token is not valid"))?;
        if role == Role::Admin && !caller.admin {
            return Err(Status::permission_denied(format!(
                "`{}` is a gateway token; this call needs an admin token",
                caller.name
            )));
        }
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(value: Option<&str>) -> MetadataMap {
        let mut map = MetadataMap::new();
        if let Some(value) = value {
            map.insert("authorization", value.parse().unwrap());
        }
        map
    }

    #[test]
    fn roles_and_refusals() {
        let tokens = Tokens::new(
            vec![Token::new("gw", b"g-secret")],
            vec![Token::new("trusted", b"t-secret")],
            vec![Token::new("ops", b"a-secret")],
        );
        let gateway = tokens
            .authorize(&metadata(Some("Bearer g-secret")), Role::Gateway)
            .unwrap();
        assert_eq!(gateway.name, "gw");
        assert!(matches!(
            gateway.check_may_assert(),
            Err(crate::service::pipeline::Refusal::PermissionDenied(_))
        ));
        let trusted = tokens
            .authorize(&metadata(Some("Bearer t-secret")), Role::Gateway)
            .unwrap();
        assert!(trusted.check_may_assert().is_ok() && !trusted.admin);
        assert_eq!(
            tokens
                .authorize(&metadata(Some("Bearer t-secret")), Role::Admin)
                .unwrap_err()
                .code(),
            tonic::Code::PermissionDenied
        );
        let denied = tokens
            .authorize(&metadata(Some("Bearer g-secret")), Role::Admin)
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        let admin = tokens
            .authorize(&metadata(Some("Bearer a-secret")), Role::Gateway)
            .unwrap();
        assert!(admin.admin && admin.check_may_assert().is_ok());
        for bad in [None, Some("Bearer nope"), Some("g-secret"), Some("Bearer ")] {
            let error = tokens.authorize(&metadata(bad), Role::Gateway).unwrap_err();
            assert_eq!(error.code(), tonic::Code::Unauthenticated);
            assert!(!error.message().contains("nope"));
        }
    }

    #[test]
    fn no_tokens_means_loopback_with_every_role() {
        let caller = Tokens::default().authorize(&metadata(None), Role::Admin).unwrap();
        assert_eq!(caller.name, LOOPBACK);
    }
}
