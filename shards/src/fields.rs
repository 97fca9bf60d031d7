//! Read access to a request's header fields, whatever protocol carried them: the one view the
//! request path (`request::`) and the routing rules that read fields (`routing::priority`)
//! share. It sits at the bottom of the crate so that both can use it. Pure.

/// A request's headers as the request path reads them.
pub trait RequestHeaders {
    /// The first value of header `name`, compared without regard to case.
    fn get(&self, name: &str) -> Option<&[u8]>;

    /// Where the client addressed the request: HTTP/1's `Host`, HTTP/2's `:authority`.
    fn authority(&self) -> Option<&[u8]>;

    /// The request target as the client sent it: HTTP/1's (origin or absolute form), HTTP/2's
    /// `:path`.
    fn target(&self) -> &[u8];

    /// Whether header `name` (any case) is present (`value: None`), or has a field line whose
    /// value is `value`, byte for byte: every line of a repeated header is looked at, not only
    /// the first (routing rules match on any of them).
    fn has(&self, name: &str, value: Option<&[u8]>) -> bool;
}

/// Headers as a list of `(name, value)` pairs, `Host` being the authority: what the tests of
/// the header rules use, and a front with no header structure of its own could.
impl RequestHeaders for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_bytes())
    }

    fn authority(&self) -> Option<&[u8]> {
        RequestHeaders::get(self, kactivator_api::headers::HOST)
    }

    /// The `:path` pair, else `/`.
    fn target(&self) -> &[u8] {
        RequestHeaders::get(self, ":path").unwrap_or(b"/")
    }

    fn has(&self, name: &str, value: Option<&[u8]>) -> bool {
        self.iter().any(|(field, field_value)| {
            field.eq_ignore_ascii_case(name) && value.is_none_or(|v| field_value.as_bytes() == v)
        })
    }
}
