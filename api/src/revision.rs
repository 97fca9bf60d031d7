//! [`RevisionKey`]: a revision's namespace and name, the key every map of revisions uses.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The cluster domain of a revision's cluster-local name `<rev>.<ns>.svc.<domain>` when
/// neither resolv.conf nor `CLUSTER_DOMAIN` gives one: `cluster.local`, knative.dev/pkg's default
/// (`network/domain.go`).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// A revision, `namespace/name`. Cloning it is one reference count; comparing, hashing and
/// ordering it is comparing, hashing and ordering the text `namespace/name`, so a map keyed by
/// `RevisionKey` can be searched with a `&str` spelled that way (see [`RevisionKey::spell`]).
///
/// Kubernetes names never contain `/`, so the first `/` separates the two parts; both are
/// non-empty.
#[derive(Clone)]
pub struct RevisionKey {
    text: Arc<str>,
    /// Byte offset of the `/`.
    slash: usize,
}

/// Why a namespace and name do not make a [`RevisionKey`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionKeyError(String);

impl fmt::Display for RevisionKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RevisionKeyError {}

impl RevisionKey {
    /// The key of revision `name` in `namespace`. Both must be non-empty and free of `/`.
    pub fn new(namespace: &str, name: &str) -> Result<RevisionKey, RevisionKeyError> {
        for (what, value) in [("namespace", namespace), ("name", name)] {
            if value.is_empty() || value.contains('/') {
                return Err(RevisionKeyError(format!(
                    "revision {what} {value:?} must be non-empty and without '/'"
                )));
            }
        }
        let mut text = String::with_capacity(namespace.len() + 1 + name.len());
        RevisionKey::spell(namespace, name, &mut text);
        Ok(RevisionKey {
            text: text.into(),
            slash: namespace.len(),
        })
    }

    /// Parses `namespace/name`.
    pub fn parse(text: &str) -> Result<RevisionKey, RevisionKeyError> {
        let (namespace, name) = text
            .split_once('/')
            .ok_or_else(|| RevisionKeyError(format!("{text:?} is not namespace/name")))?;
        RevisionKey::new(namespace, name)
    }

    /// Writes `namespace/name` into `out` (cleared first): the text a map keyed by
    /// `RevisionKey` is searched with, spelled without allocating a key.
    #[inline]
    pub fn spell(namespace: &str, name: &str, out: &mut String) {
        out.clear();
        out.push_str(namespace);
        out.push('/');
        out.push_str(name);
    }

    pub fn namespace(&self) -> &str {
        &self.text[..self.slash]
    }

    pub fn name(&self) -> &str {
        &self.text[self.slash + 1..]
    }

    /// `namespace/name`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for RevisionKey {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for RevisionKey {}

impl Hash for RevisionKey {
    // Must hash exactly as `str` does: maps keyed by `RevisionKey` are searched with `&str`.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialOrd for RevisionKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RevisionKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Borrow<str> for RevisionKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for RevisionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for RevisionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn a_key_keeps_its_parts_and_spells_namespace_slash_name() {
        let key = RevisionKey::new("default", "hello-00001").unwrap();
        assert_eq!(key.namespace(), "default");
        assert_eq!(key.name(), "hello-00001");
        assert_eq!(key.as_str(), "default/hello-00001");
        assert_eq!(key.to_string(), "default/hello-00001");
        assert_eq!(RevisionKey::parse("default/hello-00001").unwrap(), key);
    }

    #[test]
    fn empty_parts_and_slashes_are_refused() {
        for (namespace, name) in [("", "a"), ("a", ""), ("a/b", "c"), ("a", "b/c")] {
            assert!(
                RevisionKey::new(namespace, name).is_err(),
                "{namespace:?} {name:?}"
            );
        }
        assert!(RevisionKey::parse("no-slash").is_err());
        assert!(RevisionKey::parse("a/b/c").is_err());
    }

    #[test]
    fn maps_keyed_by_revision_key_are_searched_with_the_spelled_text() {
        let key = RevisionKey::new("ns", "rev").unwrap();
        let mut spelled = String::new();
        RevisionKey::spell("ns", "rev", &mut spelled);
        let hashed: HashMap<RevisionKey, u32> = [(key.clone(), 1)].into();
        let ordered: BTreeMap<RevisionKey, u32> = [(key, 2)].into();
        assert_eq!(hashed.get(spelled.as_str()), Some(&1));
        assert_eq!(ordered.get(spelled.as_str()), Some(&2));
        assert_eq!(hashed.get("ns/other"), None);
    }
}
