//! Reading what the dry-run commands answer from: the artifact (a path, or
//! `-` for standard input) and the optional declared catalog. Anything that
//! cannot be read or loaded is an input failure (exit 3), never an empty
//! policy or an empty catalog.

use std::io::Read;
use std::path::Path;

use capgate_core::capabilities::Catalog;
use capgate_core::policy::{compile, load_catalog, Compilation};

use super::Failure;

/// An artifact as read: where it came from (as given on the command line, or
/// `-`) and its bytes.
#[derive(Debug, Clone)]
pub struct Source {
    pub origin: String,
    pub bytes: Vec<u8>,
}

impl Source {
    /// The text, for source snippets. The compiler refuses bytes that are not
    /// UTF-8 at the first bad byte, so everything before it is shown as is.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes)
    }
}

/// An artifact and what compiling it gave.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub source: Source,
    pub compilation: Compilation,
}

impl Loaded {
    /// Compiles an artifact, against the catalog when one was given.
    pub fn compile(source: Source, catalog: Option<&Catalog>) -> Self {
        let compilation = compile(&source.bytes, catalog);
        Loaded { source, compilation }
    }
}

/// The files of one invocation. Standard input is read at most once: `diff - -`
/// compares the same bytes with themselves rather than the rest of the stream.
pub struct Inputs<'a> {
    stdin: &'a mut dyn Read,
    stdin_bytes: Option<Vec<u8>>,
}

impl<'a> Inputs<'a> {
    pub fn new(stdin: &'a mut dyn Read) -> Self {
        Inputs {
            stdin,
            stdin_bytes: None,
        }
    }

    /// Reads a policy argument: `-` is standard input, anything else a path.
    pub fn policy(&mut self, argument: &Path) -> Result<Source, Failure> {
        if argument.as_os_str() == "-" {
            let bytes = match &self.stdin_bytes {
                Some(bytes) => bytes.clone(),
                None => {
                    let mut bytes = Vec::new();
                    self.stdin.read_to_end(&mut bytes).map_err(|error| {
                        Failure::Input(format!("cannot read the policy from standard input: {error}"))
                    })?;
                    self.stdin_bytes = Some(bytes.clone());
                    bytes
                }
            };
            return Ok(Source {
                origin: "-".to_owned(),
                bytes,
            });
        }
        let origin = argument.to_string_lossy().into_owned();
        let bytes = std::fs::read(argument).map_err(|error| {
            Failure::Input(format!("cannot read the policy `{origin}`: {}", describe(&error)))
        })?;
        Ok(Source { origin, bytes })
    }

    /// Reads and loads `--catalog`, if given. A catalog that fails to load is
    /// an input failure, never "no tools".
    pub fn catalog(&mut self, argument: Option<&Path>) -> Result<Option<Catalog>, Failure> {
        let Some(path) = argument else {
            return Ok(None);
        };
        let origin = path.to_string_lossy();
        let bytes = std::fs::read(path).map_err(|error| {
            Failure::Input(format!(
                "cannot read the catalog `{origin}`: {}",
                describe(&error)
            ))
        })?;
        load_catalog(&bytes)
            .map(Some)
            .map_err(|error| Failure::Input(format!("cannot use the catalog `{origin}`: {error}")))
    }
}

/// An I/O error in lowercase prose, without Rust's `(os error N)` suffix.
pub(crate) fn describe(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::NotFound => "no such file".to_owned(),
        ErrorKind::PermissionDenied => "permission denied".to_owned(),
        ErrorKind::IsADirectory => "it is a directory".to_owned(),
        ErrorKind::InvalidData => "the content is not readable".to_owned(),
        _ => {
            let text = error.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
            let mut chars = text.chars();
            match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => text,
            }
        }
    }
}
