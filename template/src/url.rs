//! Go's `net/url` as far as a server request's `URL` needs it: parsing a
//! request-target the way `url.ParseRequestURI` does (which `http.ReadRequest`
//! and the HTTP/2 server use), `URL.String`, `EscapedPath`, `RequestURI`,
//! `Hostname`, `Port`; plus `textproto.CanonicalMIMEHeaderKey`.

use std::borrow::Cow;

use super::gofmt::push_percent;

/// The fields of Go's `url.URL` for a parsed request-target.
#[derive(Debug, Default)]
pub(super) struct Url<'a> {
    pub scheme: Cow<'a, [u8]>,
    pub opaque: &'a [u8],
    /// Username and optional password, unescaped.
    pub user: Option<(Vec<u8>, Option<Vec<u8>>)>,
    pub host: Cow<'a, [u8]>,
    pub path: Cow<'a, [u8]>,
    pub raw_path: &'a [u8],
    pub omit_host: bool,
    pub force_query: bool,
    pub raw_query: &'a [u8],
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Path,
    Host,
    Zone,
    UserPassword,
}

/// Go's `shouldEscape` for the modes a request-target uses.
fn should_escape(byte: u8, mode: Mode) -> bool {
    if byte.is_ascii_alphanumeric() {
        return false;
    }
    if matches!(mode, Mode::Host | Mode::Zone)
        && matches!(
            byte,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'['
                | b']'
                | b'<'
                | b'>'
                | b'"'
        )
    {
        return false;
    }
    match byte {
        b'-' | b'_' | b'.' | b'~' => false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => byte == b'?',
            Mode::UserPassword => matches!(byte, b'@' | b'/' | b'?' | b':'),
            Mode::Host | Mode::Zone => true,
        },
        _ => true,
    }
}

fn unhex(byte: u8) -> u8 {
    match byte {
        b'0'..=b'9' => byte - b'0',
        b'a'..=b'f' => byte - b'a' + 10,
        b'A'..=b'F' => byte - b'A' + 10,
        _ => 0,
    }
}

/// Go's `unescape`; `None` where Go returns an error.
fn unescape(text: &[u8], mode: Mode) -> Option<Cow<'_, [u8]>> {
    let mut index = 0;
    let mut escapes = 0;
    while index < text.len() {
        match text[index] {
            b'%' => {
                let (high, low) = (*text.get(index + 1)?, *text.get(index + 2)?);
                if !high.is_ascii_hexdigit() || !low.is_ascii_hexdigit() {
                    return None;
                }
                let value = unhex(high) << 4 | unhex(low);
                let is_percent = high == b'2' && low == b'5';
                if mode == Mode::Host && unhex(high) < 8 && !is_percent {
                    return None;
                }
                if mode == Mode::Zone
                    && !is_percent
                    && value != b' '
                    && should_escape(value, Mode::Host)
                {
                    return None;
                }
                escapes += 1;
                index += 3;
            }
            byte => {
                if matches!(mode, Mode::Host | Mode::Zone)
                    && byte < 0x80
                    && should_escape(byte, mode)
                {
                    return None;
                }
                index += 1;
            }
        }
    }
    if escapes == 0 {
        return Some(Cow::Borrowed(text));
    }
    let mut decoded = Vec::with_capacity(text.len());
    let mut index = 0;
    while index < text.len() {
        if text[index] == b'%' {
            decoded.push(unhex(text[index + 1]) << 4 | unhex(text[index + 2]));
            index += 3;
        } else {
            decoded.push(text[index]);
            index += 1;
        }
    }
    Some(Cow::Owned(decoded))
}

/// Go's `escape` for path, host and userinfo modes.
fn escape(out: &mut Vec<u8>, text: &[u8], mode: Mode) {
    for &byte in text {
        if should_escape(byte, mode) {
            push_percent(out, byte);
        } else {
            out.push(byte);
        }
    }
}

fn escape_equals(raw: &[u8], decoded: &[u8], mode: Mode) -> bool {
    let mut escaped = Vec::with_capacity(raw.len());
    escape(&mut escaped, decoded, mode);
    escaped == raw
}

fn valid_optional_port(port: &[u8]) -> bool {
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

fn parse_host(host: &[u8]) -> Option<Cow<'_, [u8]>> {
    if host.first() == Some(&b'[') {
        let close = host.iter().rposition(|&b| b == b']')?;
        if !valid_optional_port(&host[close + 1..]) {
            return None;
        }
        if let Some(zone) = find(&host[..close], b"%25") {
            let mut joined = unescape(&host[..zone], Mode::Host)?.into_owned();
            joined.extend_from_slice(&unescape(&host[zone..close], Mode::Zone)?);
            joined.extend_from_slice(&unescape(&host[close..], Mode::Host)?);
            return Some(Cow::Owned(joined));
        }
    } else if let Some(colon) = host.iter().rposition(|&b| b == b':') {
        if !valid_optional_port(&host[colon..]) {
            return None;
        }
    }
    unescape(host, Mode::Host)
}

fn valid_userinfo(userinfo: &[u8]) -> bool {
    userinfo.iter().all(|&byte| {
        byte.is_ascii_alphanumeric()
            || matches!(
                byte,
                b'-' | b'.'
                    | b'_'
                    | b':'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b'%'
                    | b'@'
            )
    })
}

type User = Option<(Vec<u8>, Option<Vec<u8>>)>;

fn parse_authority(authority: &[u8]) -> Option<(User, Cow<'_, [u8]>)> {
    let Some(at) = authority.iter().rposition(|&b| b == b'@') else {
        return Some((None, parse_host(authority)?));
    };
    let host = parse_host(&authority[at + 1..])?;
    let userinfo = &authority[..at];
    if !valid_userinfo(userinfo) {
        return None;
    }
    let user = match userinfo.iter().position(|&b| b == b':') {
        None => (unescape(userinfo, Mode::UserPassword)?.into_owned(), None),
        Some(colon) => (
            unescape(&userinfo[..colon], Mode::UserPassword)?.into_owned(),
            Some(unescape(&userinfo[colon + 1..], Mode::UserPassword)?.into_owned()),
        ),
    };
    Some((Some(user), host))
}

/// Splits a leading `scheme:` like Go's `getScheme`; `None` on its error.
fn split_scheme(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    for (index, &byte) in raw.iter().enumerate() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if index > 0 => {}
            b':' if index == 0 => return None,
            b':' => return Some((&raw[..index], &raw[index + 1..])),
            _ => return Some((&[], raw)),
        }
    }
    Some((&[], raw))
}

/// Parses a request-target like `url.ParseRequestURI`, with Go's CONNECT
/// special case (an authority-form target becomes the URL's host);
/// `None` where Go would have rejected the request.
pub(super) fn parse_request_target<'a>(target: &'a [u8], method: &[u8]) -> Option<Url<'a>> {
    if target.iter().any(|&b| b < b' ' || b == 0x7F) {
        return None;
    }
    if method == b"CONNECT" && target.first() != Some(&b'/') {
        // Go parses "http://" + target and then clears the scheme.
        let mut url = Url::default();
        let rest = split_query(&mut url, target);
        let slash = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
        let (user, host) = parse_authority(&rest[..slash])?;
        url.user = user;
        url.host = host;
        set_path(&mut url, &rest[slash..])?;
        return Some(url);
    }
    if target.is_empty() {
        return None;
    }
    if target == b"*" {
        return Some(Url {
            path: Cow::Borrowed(target),
            ..Url::default()
        });
    }
    let (scheme, rest) = split_scheme(target)?;
    let mut url = Url {
        scheme: lowercase(scheme),
        ..Url::default()
    };
    let rest = split_query(&mut url, rest);
    if rest.first() != Some(&b'/') {
        if !url.scheme.is_empty() {
            url.opaque = rest;
            return Some(url);
        }
        return None;
    }
    let mut path = rest;
    if !url.scheme.is_empty() && rest.starts_with(b"//") {
        let authority_and_path = &rest[2..];
        let slash = authority_and_path.iter().position(|&b| b == b'/');
        let authority = &authority_and_path[..slash.unwrap_or(authority_and_path.len())];
        path = slash.map_or(&[][..], |s| &authority_and_path[s..]);
        let (user, host) = parse_authority(authority)?;
        url.user = user;
        url.host = host;
    } else if !url.scheme.is_empty() {
        url.omit_host = true;
    }
    set_path(&mut url, path)?;
    Some(url)
}

fn split_query<'a>(url: &mut Url<'a>, rest: &'a [u8]) -> &'a [u8] {
    let question_marks = rest.iter().filter(|&&b| b == b'?').count();
    if rest.last() == Some(&b'?') && question_marks == 1 {
        url.force_query = true;
        return &rest[..rest.len() - 1];
    }
    match rest.iter().position(|&b| b == b'?') {
        Some(mark) => {
            url.raw_query = &rest[mark + 1..];
            &rest[..mark]
        }
        None => rest,
    }
}

fn set_path<'a>(url: &mut Url<'a>, raw: &'a [u8]) -> Option<()> {
    let path = unescape(raw, Mode::Path)?;
    if !escape_equals(raw, &path, Mode::Path) {
        url.raw_path = raw;
    }
    url.path = path;
    Some(())
}

fn lowercase(bytes: &[u8]) -> Cow<'_, [u8]> {
    if bytes.iter().any(u8::is_ascii_uppercase) {
        Cow::Owned(bytes.to_ascii_lowercase())
    } else {
        Cow::Borrowed(bytes)
    }
}

impl Url<'_> {
    /// Go's `URL.EscapedPath`.
    pub fn push_escaped_path(&self, out: &mut Vec<u8>) {
        let raw = self.raw_path;
        if !raw.is_empty()
            && raw.iter().all(|&byte| {
                matches!(
                    byte,
                    b'!' | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                        | b':'
                        | b'@'
                        | b'['
                        | b']'
                        | b'%'
                ) || !should_escape(byte, Mode::Path)
            })
            && unescape(raw, Mode::Path).is_some_and(|decoded| *decoded == *self.path)
        {
            out.extend_from_slice(raw);
            return;
        }
        if *self.path == *b"*" {
            out.push(b'*');
            return;
        }
        escape(out, &self.path, Mode::Path);
    }

    /// Go's `URL.String`.
    pub fn push_string(&self, out: &mut Vec<u8>) {
        let start = out.len();
        if !self.scheme.is_empty() {
            out.extend_from_slice(&self.scheme);
            out.push(b':');
        }
        if !self.opaque.is_empty() {
            out.extend_from_slice(self.opaque);
        } else {
            let has_authority = !self.scheme.is_empty() || !self.host.is_empty();
            if (has_authority || self.user.is_some())
                && !(self.omit_host && self.host.is_empty() && self.user.is_none())
            {
                if !self.host.is_empty() || !self.path.is_empty() || self.user.is_some() {
                    out.extend_from_slice(b"//");
                }
                if let Some((name, password)) = &self.user {
                    escape(out, name, Mode::UserPassword);
                    if let Some(password) = password {
                        out.push(b':');
                        escape(out, password, Mode::UserPassword);
                    }
                    out.push(b'@');
                }
                escape(out, &self.host, Mode::Host);
            }
            let path_start = out.len();
            self.push_escaped_path(out);
            let path = out.split_off(path_start);
            if path.first().is_some_and(|&b| b != b'/') && !self.host.is_empty() {
                out.push(b'/');
            }
            if out.len() == start {
                let segment = path.split(|&b| b == b'/').next().unwrap_or(&[]);
                if segment.contains(&b':') {
                    out.extend_from_slice(b"./");
                }
            }
            out.extend_from_slice(&path);
        }
        if self.force_query || !self.raw_query.is_empty() {
            out.push(b'?');
            out.extend_from_slice(self.raw_query);
        }
    }

    /// Go's `URL.RequestURI`.
    pub fn push_request_uri(&self, out: &mut Vec<u8>) {
        if self.opaque.is_empty() {
            let start = out.len();
            self.push_escaped_path(out);
            if out.len() == start {
                out.push(b'/');
            }
        } else {
            if self.opaque.starts_with(b"//") {
                out.extend_from_slice(&self.scheme);
                out.push(b':');
            }
            out.extend_from_slice(self.opaque);
        }
        if self.force_query || !self.raw_query.is_empty() {
            out.push(b'?');
            out.extend_from_slice(self.raw_query);
        }
    }

    /// Go's `splitHostPort` on the host: (hostname, port).
    pub fn host_and_port(&self) -> (&[u8], &[u8]) {
        let mut host: &[u8] = &self.host;
        let mut port: &[u8] = &[];
        let colon = host.iter().rposition(|&b| b == b':');
        if let Some(colon) = colon.filter(|&colon| valid_optional_port(&host[colon..])) {
            port = &host[colon + 1..];
            host = &host[..colon];
        }
        if host.len() >= 2 && host[0] == b'[' && host[host.len() - 1] == b']' {
            host = &host[1..host.len() - 1];
        }
        (host, port)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Go's header-name byte class (RFC 7230 `tchar`).
fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// `textproto.CanonicalMIMEHeaderKey`: `x-b3-traceid` → `X-B3-Traceid`;
/// a name with a byte outside the token set stays as it is.
pub(super) fn canonical_header_key(name: &[u8]) -> Cow<'_, [u8]> {
    if !name.iter().all(|&b| is_token_byte(b)) || is_canonical(name) {
        return Cow::Borrowed(name);
    }
    let mut upper = true;
    let canonical = name
        .iter()
        .map(|&byte| {
            let converted = if upper {
                byte.to_ascii_uppercase()
            } else {
                byte.to_ascii_lowercase()
            };
            upper = converted == b'-';
            converted
        })
        .collect();
    Cow::Owned(canonical)
}

fn is_canonical(name: &[u8]) -> bool {
    let mut upper = true;
    name.iter().all(|&byte| {
        let ok = if upper {
            !byte.is_ascii_lowercase()
        } else {
            !byte.is_ascii_uppercase()
        };
        upper = byte == b'-';
        ok
    })
}

/// Whether the received header `name` is stored under `key` in Go's header
/// map, i.e. `CanonicalMIMEHeaderKey(name) == key`, without allocating.
pub(super) fn header_name_matches(name: &[u8], key: &[u8]) -> bool {
    if name.len() != key.len() {
        return false;
    }
    if !name.iter().all(|&b| is_token_byte(b)) {
        return name == key;
    }
    let mut upper = true;
    name.iter().zip(key).all(|(&byte, &wanted)| {
        let converted = if upper {
            byte.to_ascii_uppercase()
        } else {
            byte.to_ascii_lowercase()
        };
        upper = converted == b'-';
        converted == wanted
    })
}
