//! Declared issuers: how callers are recognised and which attributes exist.

/// The three ways a caller can be recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IssuerKind {
    Oidc,
    StaticKey,
    Mtls,
}

impl IssuerKind {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "oidc" => Some(IssuerKind::Oidc),
            "static-key" => Some(IssuerKind::StaticKey),
            "mtls" => Some(IssuerKind::Mtls),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IssuerKind::Oidc => "oidc",
            IssuerKind::StaticKey => "static-key",
            IssuerKind::Mtls => "mtls",
        }
    }
}

/// A declared issuer, as compiled (docs/reference.md#compilation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issuer {
    pub id: String,
    pub kind: IssuerKind,
    /// The attribute map as written: name → `claim:…`, `dn:…` or a literal.
    pub attributes: Vec<(String, String)>,
    pub subject: Option<String>,
    /// An `oidc` issuer's discovery document URL (needed to authenticate).
    pub discovery: Option<String>,
    /// An `oidc` issuer's expected `aud`, when declared.
    pub audience: Option<String>,
    /// Where a static key lives; a reference, never the key.
    pub secret_ref: Option<String>,
    /// `/principals/issuers/i`.
    pub path: String,
}

impl Issuer {
    /// Whether the issuer declares an attribute of that name.
    pub fn declares(&self, name: &str) -> bool {
        self.attributes.iter().any(|(declared, _)| declared == name)
    }

    /// Whether the service can authenticate a credential of this issuer
    /// (docs/reference.md#normalisation step 1): an `oidc` issuer needs `discovery`, a
    /// `static-key` issuer `subject` and `secret`; `mtls` needs nothing.
    pub fn can_authenticate(&self) -> bool {
        match self.kind {
            IssuerKind::Oidc => self.discovery.is_some(),
            IssuerKind::StaticKey => self.subject.is_some() && self.secret_ref.is_some(),
            IssuerKind::Mtls => true,
        }
    }

    /// For a static-key issuer, the literal attribute values every principal
    /// of it carries; other kinds have none.
    pub fn literal_attributes(&self) -> impl Iterator<Item = (&str, &str)> {
        let literal = self.kind == IssuerKind::StaticKey;
        self.attributes
            .iter()
            .filter(move |_| literal)
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }
}
