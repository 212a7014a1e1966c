//! Secrets: passwords and tokens, read from a variable or from a file (the
//! `*_FILE` convention of container secrets), and never printed: `Debug`
//! shows `***`, and an error names the variable and the path, not what the
//! file holds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A password or token. Cloning shares it; printing hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{variable}: cannot read {}", path.display())]
    Read {
        variable: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{variable}: {} is empty", path.display())]
    Empty { variable: String, path: PathBuf },
    #[error("{variable}: {} is not UTF-8 text", path.display())]
    NotUtf8 { variable: String, path: PathBuf },
    #[error("{variable}: the secret in {} spans several lines", path.display())]
    SeveralLines { variable: String, path: PathBuf },
    #[error("set {value_variable} or {file_variable}, not both")]
    Both {
        value_variable: &'static str,
        file_variable: &'static str,
    },
}

/// Reads the secret in `path`, named by `variable` in errors. One trailing
/// line break is dropped (editors and `echo` add it); a secret of several
/// lines, or none, is refused rather than guessed at.
pub fn read_secret_file(variable: &str, path: &Path) -> Result<Secret, SecretError> {
    let bytes = std::fs::read(path).map_err(|source| SecretError::Read {
        variable: variable.to_owned(),
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|_| SecretError::NotUtf8 {
        variable: variable.to_owned(),
        path: path.to_owned(),
    })?;
    let text = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if text.is_empty() {
        return Err(SecretError::Empty {
            variable: variable.to_owned(),
            path: path.to_owned(),
        });
    }
    if text.contains(['\n', '\r']) {
        return Err(SecretError::SeveralLines {
            variable: variable.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(Secret::new(text))
}

/// The secret given either as a value or as a file, or none; both is an
/// error, as which one wins would be a guess. An empty value counts as
/// none (as `${VAR:-}` in compose leaves a variable).
pub fn value_or_file(
    value: Option<&Secret>,
    value_variable: &'static str,
    file: Option<&Path>,
    file_variable: &'static str,
) -> Result<Option<Secret>, SecretError> {
    let value = value.filter(|value| !value.expose().is_empty());
    match (value, file) {
        (Some(_), Some(_)) => Err(SecretError::Both {
            value_variable,
            file_variable,
        }),
        (Some(value), None) => Ok(Some(value.clone())),
        (None, Some(path)) => read_secret_file(file_variable, path).map(Some),
        (None, None) => Ok(None),
    }
}

#[cfg(feature = "cli")]
impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &[u8]) -> (tempfile_dir::Dir, PathBuf) {
        let dir = tempfile_dir::Dir::new();
        let path = dir.0.join("secret");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    /// A directory removed when dropped (no tempfile dependency for one test).
    mod tempfile_dir {
        pub(super) struct Dir(pub(super) std::path::PathBuf);
        impl Dir {
            pub(super) fn new() -> Self {
                let path =
                    std::env::temp_dir().join(format!("secret-test-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir(&path).unwrap();
                Self(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn a_file_gives_its_one_line_and_never_prints_it() {
        for content in [&b"s3cret"[..], b"s3cret\n", b"s3cret\r\n"] {
            let (_dir, path) = file(content);
            let secret = read_secret_file("X_FILE", &path).unwrap();
            assert_eq!(secret.expose(), "s3cret");
            assert_eq!(format!("{secret:?}"), "Secret(***)");
        }
    }

    #[test]
    fn empty_several_lines_binary_and_missing_are_refused_without_the_content() {
        for (content, expected) in [
            (&b""[..], "is empty"),
            (b"\n", "is empty"),
            (b"one\ntwo", "several lines"),
            (b"\xff\xfe", "not UTF-8"),
        ] {
            let (_dir, path) = file(content);
            let error = read_secret_file("X_FILE", &path).unwrap_err().to_string();
            assert!(error.starts_with("X_FILE: "), "{error}");
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("one") && !error.contains("two"), "{error}");
        }
        let error = read_secret_file("X_FILE", Path::new("/nonexistent/secret")).unwrap_err();
        assert_eq!(error.to_string(), "X_FILE: cannot read /nonexistent/secret");
    }

    #[test]
    fn a_value_and_a_file_together_are_refused() {
        let (_dir, path) = file(b"from-file");
        let value = Secret::new("from-value");
        assert!(matches!(
            value_or_file(Some(&value), "X", Some(&path), "X_FILE"),
            Err(SecretError::Both { .. })
        ));
        let chosen = value_or_file(None, "X", Some(&path), "X_FILE")
            .unwrap()
            .unwrap();
        assert_eq!(chosen.expose(), "from-file");
        let chosen = value_or_file(Some(&value), "X", None, "X_FILE")
            .unwrap()
            .unwrap();
        assert_eq!(chosen.expose(), "from-value");
        assert!(value_or_file(None, "X", None, "X_FILE").unwrap().is_none());
        let empty = Secret::new("");
        assert!(
            value_or_file(Some(&empty), "X", None, "X_FILE")
                .unwrap()
                .is_none()
        );
        let chosen = value_or_file(Some(&empty), "X", Some(&path), "X_FILE")
            .unwrap()
            .unwrap();
        assert_eq!(chosen.expose(), "from-file", "an empty value is no value");
    }
}
