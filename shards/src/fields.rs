//! Read access to a request's header fields, whatever protocol carried them: the one view the
//! request path (`request::`) and the routing rules that read fields (`routing::priority`)
//! share. It sits at the bottom of the crate so that both can use it. Pure.

/// A request's headers as the request path reads them.
pub trait RequestHeaders {
    /// The first value of header `name`, compared without regard to case.
    fn get(&self, name: &str) -> Option<&[u8]>;

    /// Where the client addressed the request: HTTP/1's `Host`, HTTP/2's `:authority`.
    fn authority(&self) -> Option<&[u8]>;
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
}
