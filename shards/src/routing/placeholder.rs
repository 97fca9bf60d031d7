//! KEDA's HTTP add-on's placeholder (`coldStart.placeholder.response` of an InterceptorRoute,
//! the add-on's 0.15, `interceptor/middleware/placeholder.go` at v0.15.0): while a route has no
//! ready endpoint, a request is answered at once with a response the route declares, instead of
//! waiting. The request still counts, so KEDA still scales the route up. Pure: the route's
//! declaration and the request's path in, the response out.
//!
//! * The status is the declared one, 503 when unset.
//! * The body is inline, or a ConfigMap's value: at the declared key, else at the request's
//!   path without its leading `/` (`index.html` for `/`). A missing ConfigMap or a missing
//!   declared key is the add-on's 500 `Internal Server Error`; a missing path-derived key, an
//!   empty body (so `/favicon.ico` degrades quietly).
//! * The fields are the declared ones; a ConfigMap value's `Content-Type` comes from its key's
//!   extension (Go's `mime.TypeByExtension`) unless one is declared; otherwise a non-empty body
//!   gets the type Go's server sniffs for text and HTML, as the add-on's `ResponseWriter` would.
//!
//! The same response answers a route's static routes (0.16's `staticRoutes`, [`StaticRoute`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::routing::rules::Rule;

/// One of a route's static routes (KEDA's add-on 0.16, `staticRoutes` of an InterceptorRoute,
/// `interceptor/middleware/static_route.go` on its `main`): a request of the route that one of
/// its `rules` matches ([`Rule::matches`]; the first static route that matches wins) is not
/// counted, so it never scales the route, and is never held: it gets `response` (the add-on's
/// default status there is 200) when `always`, or when the route has no routable pod; else it
/// goes to a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticRoute {
    pub rules: Vec<Rule>,
    pub response: Arc<Placeholder>,
    /// `responseMode: Always`; false: `WhenUnavailable`, the default.
    pub always: bool,
}

/// A route's placeholder response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placeholder {
    /// The status; the add-on's 503 when the route sets none.
    pub status: u16,
    /// The declared fields, names as the route writes them (each a valid field; the framing
    /// fields and `Date` are the writer's and never among them).
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: PlaceholderBody,
}

/// Where a placeholder's body comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlaceholderBody {
    Inline(Vec<u8>),
    /// A ConfigMap of the route's namespace labelled `http.keda.sh/response-body: "true"`:
    /// its data (`None`: no such ConfigMap), and the key the route names (`None`: the
    /// request's path).
    ConfigMap {
        name: String,
        data: Option<ConfigMapData>,
        key: Option<String>,
    },
}

/// A ConfigMap's data by key, shared by every response that reads it.
pub type ConfigMapData = Arc<BTreeMap<String, Vec<u8>>>;

/// The status a placeholder answers with when its route sets none.
pub const DEFAULT_PLACEHOLDER_STATUS: u16 = 503;

/// The body of the add-on's 500 when a placeholder cannot be made (Go's `http.Error`).
pub const PLACEHOLDER_FAILED: &str = "Internal Server Error\n";

/// The ConfigMap key of the request path `/`.
const INDEX_KEY: &str = "index.html";

/// A placeholder's response to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceholderResponse<'p> {
    pub status: u16,
    /// The declared fields, then the `Content-Type` found when none is declared.
    pub fields: Vec<(&'p str, &'p [u8])>,
    pub body: &'p [u8],
}

/// Why a placeholder cannot answer: the add-on's 500, and what to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceholderError(pub String);

impl Placeholder {
    /// The response to a request for `path` (the request target's path, as it came).
    pub fn respond(&self, path: &[u8]) -> Result<PlaceholderResponse<'_>, PlaceholderError> {
        let (body, key_type): (&[u8], Option<&'static str>) = match &self.body {
            PlaceholderBody::Inline(body) => (body, None),
            PlaceholderBody::ConfigMap { name, data, key } => {
                let Some(data) = data else {
                    return Err(PlaceholderError(format!(
                        "ConfigMap {name} not found: ensure it exists and has the label \
                         http.keda.sh/response-body=true"
                    )));
                };
                let derived;
                let lookup = match key {
                    Some(key) => key.as_str(),
                    None => {
                        derived = key_of_path(path);
                        derived.as_str()
                    }
                };
                match data.get(lookup) {
                    Some(value) => (value, mime_type(lookup)),
                    None if key.is_some() => {
                        return Err(PlaceholderError(format!(
                            "key {lookup:?} not found in ConfigMap {name}"
                        )))
                    }
                    None => (&[][..], None),
                }
            }
        };
        let mut fields: Vec<(&str, &[u8])> = self
            .fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
            .collect();
        let declared = fields
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
        if !declared {
            if let Some(found) = key_type.or_else(|| sniff(body)) {
                fields.push(("Content-Type", found.as_bytes()));
            }
        }
        Ok(PlaceholderResponse {
            status: self.status,
            fields,
            body,
        })
    }
}

/// The ConfigMap key of a request path: the path (before any query) without its leading `/`;
/// `index.html` for `/`.
fn key_of_path(path: &[u8]) -> String {
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let key = path.strip_prefix(b"/").unwrap_or(path);
    if key.is_empty() {
        INDEX_KEY.to_owned()
    } else {
        String::from_utf8_lossy(key).into_owned()
    }
}

/// Go's `mime.TypeByExtension` for the extensions of its built-in table (the ones a web page
/// is made of); `None` for any other, which leaves the type to sniffing.
fn mime_type(key: &str) -> Option<&'static str> {
    let extension = key.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match extension.as_str() {
        "avif" => "image/avif",
        "css" => "text/css; charset=utf-8",
        "gif" => "image/gif",
        "htm" | "html" => "text/html; charset=utf-8",
        "jpeg" | "jpg" => "image/jpeg",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "wasm" => "application/wasm",
        "webp" => "image/webp",
        "xml" => "text/xml; charset=utf-8",
        _ => return None,
    })
}

/// The HTML tags Go's `DetectContentType` recognises at the start of a body (after white space,
/// any case), each followed by a space or `>`.
const HTML_TAGS: [&[u8]; 17] = [
    b"<!DOCTYPE HTML",
    b"<HTML",
    b"<HEAD",
    b"<SCRIPT",
    b"<IFRAME",
    b"<H1",
    b"<DIV",
    b"<FONT",
    b"<TABLE",
    b"<A",
    b"<STYLE",
    b"<TITLE",
    b"<B",
    b"<BODY",
    b"<BR",
    b"<P",
    b"<!--",
];

/// What Go's server sniffs for a body written without a `Content-Type` (`DetectContentType`
/// over its first 512 bytes), for what a placeholder holds: HTML, XML, text, else
/// `application/octet-stream`. `None` for an empty body, which gets no type.
fn sniff(body: &[u8]) -> Option<&'static str> {
    if body.is_empty() {
        return None;
    }
    let head = &body[..body.len().min(512)];
    let start = head
        .iter()
        .position(|b| !matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' '))
        .unwrap_or(head.len());
    let rest = &head[start..];
    let is_html = HTML_TAGS.iter().any(|tag| {
        rest.len() > tag.len()
            && rest[..tag.len()].eq_ignore_ascii_case(tag)
            && matches!(rest[tag.len()], b' ' | b'>')
    });
    if is_html {
        return Some("text/html; charset=utf-8");
    }
    if rest.starts_with(b"<?xml") {
        return Some("text/xml; charset=utf-8");
    }
    // Go's "binary data byte": any control byte but the usual white space and ESC.
    let binary = head.iter().any(|&b| {
        b <= 0x08 || b == 0x0b || (0x0e..=0x1a).contains(&b) || (0x1c..=0x1f).contains(&b)
    });
    Some(if binary {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(body: &str, fields: &[(&str, &str)]) -> Placeholder {
        Placeholder {
            status: DEFAULT_PLACEHOLDER_STATUS,
            fields: fields
                .iter()
                .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
                .collect(),
            body: PlaceholderBody::Inline(body.as_bytes().to_vec()),
        }
    }

    fn from_map(data: Option<&[(&str, &str)]>, key: Option<&str>) -> Placeholder {
        Placeholder {
            status: 200,
            fields: vec![],
            body: PlaceholderBody::ConfigMap {
                name: "apps/pages".into(),
                data: data.map(|pairs| {
                    Arc::new(
                        pairs
                            .iter()
                            .map(|(key, value)| (key.to_string(), value.as_bytes().to_vec()))
                            .collect(),
                    )
                }),
                key: key.map(str::to_owned),
            },
        }
    }

    #[test]
    fn an_inline_body_goes_out_with_the_declared_fields_or_the_type_go_sniffs() {
        let declared = inline(
            "<p>soon</p>",
            &[("Retry-After", "5"), ("content-type", "text/x")],
        );
        let response = declared.respond(b"/").unwrap();
        assert_eq!(response.status, 503);
        assert_eq!(
            response.fields,
            [("Retry-After", &b"5"[..]), ("content-type", &b"text/x"[..])]
        );
        assert_eq!(response.body, b"<p>soon</p>");
        for (body, want) in [
            ("warming up", Some("text/plain; charset=utf-8")),
            (
                "  <!doctype html><title>x</title>",
                Some("text/html; charset=utf-8"),
            ),
            ("<html>", Some("text/html; charset=utf-8")),
            ("<htmlx>", Some("text/plain; charset=utf-8")),
            ("<?xml version=\"1.0\"?>", Some("text/xml; charset=utf-8")),
            ("\u{1}\u{2}", Some("application/octet-stream")),
            (
                "{\"status\":\"warming\"}",
                Some("text/plain; charset=utf-8"),
            ),
            ("", None),
        ] {
            let placeholder = inline(body, &[]);
            let response = placeholder.respond(b"/").unwrap();
            let found = response
                .fields
                .iter()
                .find(|(name, _)| *name == "Content-Type")
                .map(|(_, value)| std::str::from_utf8(value).unwrap());
            assert_eq!(found, want, "{body:?}");
        }
    }

    #[test]
    fn a_config_map_body_is_found_by_key_or_by_path_with_its_extensions_type() {
        let pages: &[(&str, &str)] = &[
            ("index.html", "<html>soon</html>"),
            ("style.css", "p{}"),
            ("notes", "plain"),
        ];
        let by_path = from_map(Some(pages), None);
        let index = by_path.respond(b"/?q=1").unwrap();
        assert_eq!(index.body, b"<html>soon</html>");
        assert_eq!(
            index.fields,
            [("Content-Type", &b"text/html; charset=utf-8"[..])]
        );
        assert_eq!(index.status, 200);
        let css = by_path.respond(b"/style.css").unwrap();
        assert_eq!(
            css.fields,
            [("Content-Type", &b"text/css; charset=utf-8"[..])]
        );
        let notes = by_path.respond(b"/notes").unwrap();
        assert_eq!(
            notes.fields,
            [("Content-Type", &b"text/plain; charset=utf-8"[..])],
            "no extension: sniffed"
        );
        let missing = by_path.respond(b"/favicon.ico").unwrap();
        assert_eq!((missing.body, missing.fields.len()), (&b""[..], 0));
        let nested = by_path.respond(b"/a/index.html").unwrap();
        assert!(
            nested.body.is_empty(),
            "a key has no '/': nested paths find nothing"
        );

        let by_key = from_map(Some(pages), Some("notes"));
        assert_eq!(by_key.respond(b"/anything").unwrap().body, b"plain");
        let wrong_key = from_map(Some(pages), Some("nope"));
        assert!(wrong_key.respond(b"/").unwrap_err().0.contains("\"nope\""));
        let no_map = from_map(None, None);
        assert!(no_map.respond(b"/").unwrap_err().0.contains("apps/pages"));
    }
}
