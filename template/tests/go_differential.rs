//! Differential test: every template × request case is rendered by Go's own
//! `text/template` + `net/http` (tests/go/oracle.go, one `go run` for the
//! whole corpus) and by this engine, and the bytes must be equal.
//!
//! Needs `go` on PATH (`scripts/test.sh` installs it); without it the test fails, saying so.

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Stdio};

use kactivator_template::{
    fallback_line, Input, Proto, Request, Response, Revision, Template, KNATIVE_1_18_DEFAULT,
    KNATIVE_1_21_DEFAULT,
};

/// Templates, by name.
const TEMPLATES: &[(&str, &str)] = &[
    (
        "knative118",
        KNATIVE_1_18_DEFAULT,
    ),
    (
        "knative121",
        KNATIVE_1_21_DEFAULT,
    ),
    ("header_map", "{{.Request.Header}}"),
    (
        "range_map",
        "{{range $k, $v := .Request.Header}}{{$k}}={{range $i, $e := $v}}{{if $i}},{{end}}{{js $e}}{{end}};{{end}}",
    ),
    (
        "url_parts",
        "{{.Request.URL}}|{{.Request.URL.Path}}|{{.Request.URL.RawQuery}}|{{.Request.URL.Scheme}}|{{.Request.URL.Host}}|{{.Request.URL.RawPath}}|{{.Request.URL.EscapedPath}}|{{.Request.URL.RequestURI}}|{{.Request.URL.Hostname}}|{{.Request.URL.Port}}|{{.Request.URL.IsAbs}}|{{.Request.URL.ForceQuery}}|{{.Request.URL.Opaque}}|{{.Request.URL.OmitHost}}|{{.Request.URL.String}}",
    ),
    (
        "request_fields",
        "{{.Request.Method}} {{.Request.Proto}} {{.Request.ProtoMajor}}.{{.Request.ProtoMinor}} {{.Request.ContentLength}} {{.Request.Host}} {{.Request.RemoteAddr}} {{.Request.RequestURI}}",
    ),
    (
        "escapers",
        r#"{{html .Request.UserAgent}}|{{urlquery .Request.UserAgent}}|{{js .Request.UserAgent}}|{{print .Request.UserAgent 1 2 "x" 3}}|{{println .Response.Code .Response.Latency}}|{{js .Response.Code .Request.Method}}|{{urlquery 1 2}}|{{html}}"#,
    ),
    (
        "printf_strings",
        r#"{{printf "%s|%q|%+q|%x|%X|%5.2s|%-8s|%v|%10v|%-3q|%.1q" .Request.Method .Request.UserAgent .Request.UserAgent .Request.Method .Request.Method .Request.UserAgent .Request.Method .Request.UserAgent .Request.Method .Request.Method .Request.UserAgent}}"#,
    ),
    (
        "printf_ints",
        r#"{{printf "%d|%5d|%-5d|%05d|%+d|% d|%x|%X|%v|%08x|%-+6d|100%%" .Response.Code .Response.Code .Response.Code .Response.Code .Response.Code .Response.Code .Response.Size .Response.Size .Response.Size .Response.Code .Response.Code}}"#,
    ),
    (
        "printf_floats",
        r#"{{printf "%v|%e|%E|%f|%.3f|%g|%G|%.3g|%10.4f|%-10.2e|%+.1f|%08.3f|% g|%.0f|%.10g|%F|%12v" .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency .Response.Latency}}"#,
    ),
    (
        "comparisons",
        r#"{{if eq .Response.Code 200}}ok{{else if ge .Response.Code 500}}err{{else}}other{{end}} {{eq .Request.Method "GET" "POST"}} {{ne .Response.Size 0}} {{lt .Response.Latency 0.5}} {{le .Request.Method "GET"}} {{gt (len .Request.Header) 2}} {{eq (index .Request.Method 0) 71}} {{lt 1 (index .Request.Method 0)}}"#,
    ),
    (
        "logic",
        r#"{{and .Request.UserAgent .Request.Referer}}|{{or .Request.Referer .Request.UserAgent "none"}}|{{not .Response.Size}}|{{and 1 "x" .Response.Code}}|{{or 0 "" .TraceID}}|{{not .Request.Header}}"#,
    ),
    (
        "index_len_slice",
        r#"{{index .Request.Header "X-A"}}|{{len (index .Request.Header "X-A")}}|{{index .Request.Header "x-a"}}|{{len .Request.Method}}|{{slice .Request.Method 1}}|{{slice .Request.Method 1 2}}|{{slice .Request.Method}}|{{index .Request.Method 0}}|{{.Request.Header.Values "x-a"}}|{{.Request.Header.Get "x-a"}}|{{.Request.Header.Get "Cache-Control"}}|{{index .Request.Header "Content-Length"}}|{{index .Request.Header "Transfer-Encoding"}}|{{index .Request.Header "Host"}}"#,
    ),
    (
        "index_out_of_range",
        r#"{{index (.Request.Header.Values "X-A") 1}}"#,
    ),
    (
        "trim_and_comments",
        "a  {{- .Request.Method -}}  b {{/* c */}} c {{- /* d */ -}} \n d{{- 3}}{{-3}} {{- \t.Response.Code\n-}}\t! {{/* x */ -}}   y",
    ),
    (
        "with_range_control",
        r#"{{with .Request.Header.Get "X-Missing"}}has {{.}}{{else}}none{{end}} {{with $x := .Request.Method}}{{$x}}{{.}}{{end}} {{range $i, $v := .Request.Header.Values "X-A"}}{{if eq $i 1}}{{continue}}{{end}}{{if eq $i 2}}{{break}}{{end}}[{{$i}}:{{$v}}]{{else}}empty{{end}} {{range .Request.Header.Values "X-A"}}<{{.}}>{{end}} {{range $v := .Request.Header.Values "X-None"}}{{$v}}{{else}}else:{{$v}}{{end}}"#,
    ),
    (
        "variables",
        r#"{{$m := .Request.Method}}{{$m}}{{$m = "changed"}}{{$m}} {{$.Revision.Name}} {{$c := .Response.Code}}{{if gt $c 299}}{{$c = 0}}{{end}}{{$c}} {{$u := .Request.UserAgent}}{{with $.Request}}{{.Method}}{{$u}}{{end}}{{if true}}{{$m := 1}}{{$m}}{{end}}{{$m}}"#,
    ),
    (
        "structs",
        r#"{{.Response}} {{.Revision}} {{print .Response}} {{js .Response}} {{printf "%v" .Revision}} {{print .Response .Revision}} {{println .Revision}}"#,
    ),
    (
        "pipelines",
        r#"{{.Request.Method | printf "%s-%s" "a"}} {{"X-A" | .Request.Header.Get}} {{.Request.UserAgent | js | len}} {{(.Request.Header).Get "accept"}} {{.Response.Code | eq 200}} {{.Request.Method | html | urlquery}} {{.Response.Code | and 0}} {{.Response.Code | or 0}}"#,
    ),
    (
        "literals",
        "{{\"a\\tb\\u00e9\\x41\\101\\U0001F600\"}} {{`raw\nx`}} {{1.5}} {{1e3}} {{0x1F}} {{017}} {{-5}} {{true}} {{'a'}} {{'\\n'}} {{1e-7}} {{0o17}} {{0b101}} {{+7}} {{.5}} {{1.}} {{-0}} {{0.1}} {{123456789.0}} {{1e21}} {{1e20}}",
    ),
    (
        "escaper_literals",
        "{{js \"\\x00\\x01\\x1f\\x7f<>&='\\\"\\\\ \\u2028\\u00a0é😀\\ufeff\\u200b`\\xff\\xed\\xa0\\x80\"}} {{html \"\\x00<a href='x'>&\\\"\"}} {{urlquery \"a b&c=d/é~-_.!*\"}} {{printf \"%q|%+q\" \"\\x00\\a\\x7fé\\u2028\\U000E0001\\xff\\\\\\\"\" \"é😀\"}}",
    ),
    ("mixed_comparison", "{{eq (or .Request.Referer 0) 0}}"),
    (
        "nil_forms",
        "{{and nil 1}}|{{print nil}}|{{js nil}}|{{printf \"%v|%5v\" nil nil}}|{{or nil}}|{{eq nil nil}}|{{eq .Request.Method nil}}|{{not nil}}|{{print nil nil 1}}|{{js nil 1}}|{{html 1 nil}}|{{println nil}}|{{ne nil 1}}",
    ),
    (
        "trace",
        r#"{{.TraceID}}|{{index .Request.Header "Traceparent"}}|{{.Request.Header.Get "X-B3-TraceId"}}"#,
    ),
    ("slice_error", "{{slice .Request.Method 2 1}}"),
    (
        "header_truthiness",
        r#"{{len .Request.Header}} {{if .Request.Header}}has{{end}} {{.Request.Header.Get "Pragma"}} {{with index .Request.Header "X-A"}}{{len .}}{{end}}"#,
    ),
    (
        "printf_composites",
        r#"{{printf "%q" .Request.URL}} {{printf "%s" .Request.Header}} {{printf "%v" (.Request.Header.Values "X-A")}} {{printf "%s|%v|%.3s" .Request.URL .Request.URL .Request.URL}} {{printf "%v %v" .Response .Revision}} {{printf "%t|%-6t|%v" true false true}}"#,
    ),
    (
        "print_spacing",
        r#"{{print 1 2}} {{print "a" 1 2 "b"}} {{print .Response.Code .Response.Latency}} {{print (index .Request.Header "X-A") 5}} {{print 1 nil}} {{println}}|{{print}}|{{print true false}} {{print .Request.URL 1}} {{println "a" 1 "b"}}"#,
    ),
    (
        "header_methods",
        r#"{{.Request.Header.Get "User-Agent" | html}}{{.Request.Referer}}|{{.Request.Header.Get "x-unknown"}}|{{.Request.Header.Values "x-unknown"}}|{{len (.Request.Header.Values "X-A")}}"#,
    ),
    ("comment_only", "{{- /* only comment */ -}}"),
    ("text_only", "plain text, no actions"),
    (
        "empty_action_parens",
        "{{(.Request.Method)}} {{((.Response.Code))}} {{(print .Response.Size)}}",
    ),
    (
        "dynamic_header_key",
        r#"{{$k := print "x-" "a"}}{{.Request.Header.Get $k}}|{{.Request.Header.Values $k}}|{{index .Request.Header (print "X-" "A")}}"#,
    ),
    (
        "else_chains",
        r#"{{if eq .Request.Method "POST"}}post{{else if eq .Request.Method "GET"}}get{{else if .Request.Header}}other{{end}}|{{if .Request.Referer}}ref{{else}}{{with .Request.UserAgent}}ua={{.}}{{end}}{{end}}"#,
    ),
    ("index_int_string_error", "{{index .Request.Method 10}}"),
    (
        "byte_compare",
        "{{index .Request.Method 0 | printf \"%d|%x|%v\" 1 2}}",
    ),
    ("delimiters_in_strings", "{{\"}}\"}}{{`{{x}}`}}{{print \"{{\" `}}`}}"),
    ("range_map_elements", "{{range .Request.Header}}{{.}}{{len .}};{{end}}"),
    ("cr_and_tabs", "a\r\n{{- \"x\" -}}\r\n\tb {{- \r\n .Request.Method}}"),
];

/// Templates Go refuses at parse time; this engine must refuse them too.
const GO_REFUSES: &[(&str, &str)] = &[
    ("unclosed_action", "{{.Request.Method"),
    ("stray_end", "a{{end}}"),
    ("stray_else", "{{else}}"),
    ("if_without_value", "{{if}}x{{end}}"),
    ("missing_end", "{{if .Request.Method}}x"),
    ("undefined_variable", "{{$x}}"),
    ("unknown_function", "{{nosuch 1}}"),
    ("non_executable_stage", "{{.Request.Method | 3}}"),
    ("break_outside_range", "{{break}}"),
    ("unterminated_string", "{{\"abc}}"),
    ("unclosed_comment", "{{/* abc"),
    ("comment_space_before_delim", "{{/* abc */ }}"),
    ("unclosed_paren", "{{(.Request.Method}}"),
    ("unmatched_paren", "{{.Request.Method)}}"),
    ("bad_number", "{{08}}"),
    ("bad_character", "{{.Request.Method#}}"),
    ("empty_action", "{{}}"),
    (
        "else_with_in_if_go119",
        "{{if .Request.Method}}{{else with .Request.Host}}{{end}}",
    ),
    ("too_many_decls", "{{$a, $b := 1}}"),
    ("dot_after_literal", "{{\"a\".B}}"),
    ("bad_escape", "{{\"\\q\"}}"),
    ("range_decl_non_variable", "{{range $i, 1}}{{end}}"),
    (
        "else_if_in_with",
        "{{with .Request.Method}}{{else if .Request.Host}}{{end}}",
    ),
    ("field_on_number", "{{1.Foo}}"),
    ("lone_trim_markers", "{{- -}}"),
    ("comment_trim_without_space", "{{/* a */-}}"),
    ("control_character_in_action", "{{.Request.Method\x01}}"),
    ("declare_without_value", "{{$x :=}}"),
    ("colon_without_equals", "{{$x : 1}}"),
];

/// Templates Go accepts (and fails or behaves oddly only when executed)
/// that this engine refuses on purpose when parsing.
const WE_REFUSE: &[(&str, &str)] = &[
    ("unknown_field", "{{.Request.Foo}}"),
    ("body_field", "{{.Request.Body}}"),
    ("print_request", "{{.Request}}"),
    ("print_root", "{{.}}"),
    ("eq_int_string", r#"{{eq .Response.Code "200"}}"#),
    ("len_int", "{{len 3}}"),
    ("nil_command", "{{nil}}"),
    ("printf_bad_verb", r#"{{printf "%T" 1}}"#),
    ("printf_missing_arg", r#"{{printf "%d"}}"#),
    ("printf_extra_arg", r#"{{printf "x" 1}}"#),
    ("printf_nonliteral_format", "{{printf .Request.Method}}"),
    ("define", r#"{{define "x"}}y{{end}}"#),
    ("template", r#"{{template "x"}}"#),
    ("call", "{{call .Request.Method}}"),
    ("range_over_string", "{{range .Request.Method}}{{end}}"),
    ("header_as_field", "{{.Request.Header.Accept}}"),
    ("decl_in_parens", "{{print ($x := 1)}}"),
    (
        "slice_of_list",
        r#"{{slice (.Request.Header.Values "X-A") 0 1}}"#,
    ),
    ("args_to_field", "{{.Request.Method 1}}"),
    ("underscore_number", "{{1_000}}"),
    ("assign_other_type", "{{$x := 1}}{{$x = \"a\"}}"),
    (
        "else_branch_sees_body_var",
        "{{if .Request.Method}}{{$y := 1}}{{else}}{{$y}}{{end}}",
    ),
];

/// Raw HTTP/1.x request heads, by name.
const REQUESTS: &[(&str, &[u8])] = &[
    (
        "chunked_trailer_cookies",
        b"POST /t HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\nExpect: 100-continue\r\nCookie: a=1\r\nCookie: b=2\r\nX-A: t\r\n\r\n",
    ),
    (
        "trailer_without_chunking",
        b"POST /t HTTP/1.1\r\nHost: example.com\r\nContent-Length: 2\r\nTrailer: X-Checksum\r\n\r\n",
    ),
    (
        "simple_get",
        b"GET /index.html HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl/8.1\r\nAccept: */*\r\n\r\n",
    ),
    (
        "post_odd_values",
        b"POST /api/v1/items?id=5&name=a%20b HTTP/1.1\r\nHost: svc.ns.example.com:8080\r\nContent-Length: 5\r\nUser-Agent: Mozilla \"quoted\" <tag> & a=b 'single' \\back\r\nReferer: https://ref.example/?q=<x>\r\nX-A: 1\r\nX-B3-Traceid: 80f198ee56343ba864fe8b2a57d3eff7\r\n\r\n",
    ),
    (
        "utf8_values",
        "GET /caf\u{e9} HTTP/1.1\r\nHost: example.com\r\nUser-Agent: Caf\u{e9} \u{1F600} \u{2028}\u{a0}\u{200b}\u{feff}\u{e0001} \u{ffff}\r\nReferer: \u{3b1}\u{3b2}\r\n\r\n"
            .as_bytes(),
    ),
    (
        "invalid_utf8",
        b"GET /x HTTP/1.1\r\nHost: example.com\r\nUser-Agent: bad \xff\xfe \xe2\x82 \xed\xa0\x80 \xc0\xaf end\r\nX-A: \x80\r\n\r\n",
    ),
    (
        "repeated_headers",
        b"GET /r HTTP/1.1\r\nHost: example.com\r\nX-A: 1\r\nx-a: 2\r\nX-A: 3\r\naccept: text/html\r\nPragma: no-cache\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX-B3-TraceId: b3b3\r\n\r\n",
    ),
    (
        "chunked",
        b"POST /upload HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\nContent-Length: 10\r\nX-A: a\r\nX-A: b\r\n\r\n",
    ),
    ("http10", b"GET /old?x=1 HTTP/1.0\r\nUser-Agent: old\r\n\r\n"),
    (
        "absolute_form",
        b"GET http://Example.COM:8080/a%20b/c?x=1&y=%2F HTTP/1.1\r\nHost: other.example\r\nCache-Control: max-age=0\r\nPragma: no-cache\r\n\r\n",
    ),
    (
        "escaped_path",
        b"GET /a%2fb/%7euser/x%20y?q=%41%zz&r=%E2%82%AC HTTP/1.1\r\nHost: example.com\r\n\r\n",
    ),
    (
        "duplicate_length",
        b"PUT /p HTTP/1.1\r\nHost: example.com\r\nContent-Length: 3\r\nContent-Length: 3\r\nX-B3-Traceid: only-b3\r\ntraceparent: nodash\r\n\r\n",
    ),
    ("options_star", b"OPTIONS * HTTP/1.1\r\nHost: example.com\r\n\r\n"),
    (
        "quote_path",
        b"GET /a\"b{c}|d^e`f/\xc3\xa9?k=\"v\" HTTP/1.1\r\nHost: example.com\r\nReferer:\r\nX-Empty: \r\n\r\n",
    ),
    ("connect", b"CONNECT backend.example:443 HTTP/1.1\r\nHost: backend.example:443\r\n\r\n"),
    (
        "absolute_userinfo",
        b"GET https://user:p%40ss@[::1]:8443/x?y HTTP/1.1\r\nHost: h\r\n\r\n",
    ),
    (
        "force_query_colon",
        b"DELETE /a:b? HTTP/1.1\r\nHost: example.com\r\nX-A: only\r\nX-A: two\r\nUser-Agent:   padded value  \r\n\r\n",
    ),
    (
        "odd_names",
        b"GET /n HTTP/1.1\r\nHost: example.com\r\nx-b3-traceid: lower\r\nUSER-AGENT: UPPER\r\nx_under_score: u\r\nX-A: 1\r\nCONTENT-TYPE: text/plain\r\n\r\n",
    ),
];

/// Response values paired with requests by position.
const RESPONSES: &[(u16, u64, f64)] = &[
    (200, 0, 0.0),
    (503, 1234, 1e-05),
    (200, 9_007_199_254_740_993, 0.000123),
    (404, 5, 0.5),
    (200, 42, 12.25),
    (500, 0, 1e21),
    (301, 100, 1234567.0),
    (200, 7, 5e-324),
    (204, 0, 100000.0),
    (200, 3, 0.30000000000000004),
    (418, 1, 2.5),
    (200, 99, 0.125),
    (200, 64, 1e-7),
    (200, 1, 123456789.0),
    (599, 2, 0.1),
    (200, 10, 1e20),
];

struct Case {
    name: String,
    template: String,
    request: &'static [u8],
    remote: &'static str,
    response: Response,
    revision: Revision,
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::from("h");
    for byte in bytes {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("oracle writes hex"))
        .collect()
}

fn revision() -> Revision {
    Revision {
        name: "hello-00001".into(),
        namespace: "default".into(),
        service: "hello".into(),
        configuration: "hello".into(),
        pod_name: "hello-00001-deployment-5d8f9-abcde".into(),
        pod_ip: "10.0.0.7".into(),
    }
}

fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    let remotes = ["10.1.2.3:45678", "[fd00::1]:1234", "127.0.0.1:80"];
    for (t, (template_name, template)) in TEMPLATES.iter().enumerate() {
        for (r, (request_name, request)) in REQUESTS.iter().enumerate() {
            let (code, size, latency) = RESPONSES[(t + r) % RESPONSES.len()];
            cases.push(Case {
                name: format!("{template_name}/{request_name}"),
                template: template.to_string(),
                request,
                remote: remotes[(t + r) % remotes.len()],
                response: Response {
                    code,
                    size,
                    latency_seconds: latency,
                },
                revision: revision(),
            });
        }
    }
    // Every latency through the default templates and %v.
    for (index, &(code, size, latency)) in RESPONSES.iter().enumerate() {
        for template in ["{{.Response.Latency}}|{{.Response}}", TEMPLATES[1].1] {
            cases.push(Case {
                name: format!("latency{index}/{}", template.len()),
                template: template.to_string(),
                request: REQUESTS[index % REQUESTS.len()].1,
                remote: remotes[0],
                response: Response {
                    code,
                    size,
                    latency_seconds: latency,
                },
                revision: revision(),
            });
        }
    }
    for (name, template) in GO_REFUSES.iter().chain(WE_REFUSE) {
        cases.push(Case {
            name: format!("{name}/refusal"),
            template: template.to_string(),
            request: REQUESTS[1].1,
            remote: remotes[0],
            response: Response {
                code: 200,
                size: 1,
                latency_seconds: 0.25,
            },
            revision: revision(),
        });
    }
    cases
}

/// Test-only reading of a raw HTTP/1.x head into what Go's `ReadRequest`
/// reports: method, target, protocol, headers with trimmed values, Host,
/// ContentLength.
struct Head {
    method: Vec<u8>,
    target: Vec<u8>,
    proto: Proto,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    host: Vec<u8>,
    content_length: i64,
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |e| e + 1);
    &bytes[start..end.max(start)]
}

fn parse_head(raw: &[u8]) -> Head {
    let text_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("head ends with a blank line");
    let mut lines = raw[..text_end]
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().expect("request line");
    let mut parts = request_line.splitn(3, |&b| b == b' ');
    let method = parts.next().expect("method").to_vec();
    let target = parts.next().expect("target").to_vec();
    let proto = match parts.next().expect("proto") {
        b"HTTP/1.0" => Proto::Http10,
        b"HTTP/1.1" => Proto::Http11,
        other => panic!("unexpected protocol {other:?}"),
    };
    let headers: Vec<(Vec<u8>, Vec<u8>)> = lines
        .map(|line| {
            let colon = line.iter().position(|&b| b == b':').expect("header colon");
            (line[..colon].to_vec(), trim(&line[colon + 1..]).to_vec())
        })
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.clone())
    };
    let authority = if method == b"CONNECT" && !target.starts_with(b"/") {
        Some(target.clone())
    } else {
        target.windows(3).position(|w| w == b"://").map(|start| {
            let rest = &target[start + 3..];
            let end = rest
                .iter()
                .position(|&b| b == b'/' || b == b'?')
                .unwrap_or(rest.len());
            let authority = &rest[..end];
            let at = authority
                .iter()
                .rposition(|&b| b == b'@')
                .map_or(0, |at| at + 1);
            authority[at..].to_vec()
        })
    };
    let host = authority
        .filter(|a| !a.is_empty())
        .or_else(|| find("Host"))
        .unwrap_or_default();
    let chunked = proto == Proto::Http11 && find("Transfer-Encoding").is_some();
    let content_length = if chunked {
        -1
    } else {
        find("Content-Length").map_or(0, |v| std::str::from_utf8(&v).unwrap().parse().unwrap())
    };
    Head {
        method,
        target,
        proto,
        headers,
        host,
        content_length,
    }
}

enum Ours {
    Refused(String),
    Rendered(Vec<u8>),
    Failed(Vec<u8>),
}

fn ours(case: &Case) -> Ours {
    let template = match Template::parse(&case.template) {
        Ok(template) => template,
        Err(error) => return Ours::Refused(error.to_string()),
    };
    let head = parse_head(case.request);
    // Pass only the headers the template asks for, as the proxy will.
    let headers: Vec<(&[u8], &[u8])> = head
        .headers
        .iter()
        .filter(|(name, _)| template.headers_read().wants(name))
        .map(|(name, value)| (name.as_slice(), value.as_slice()))
        .collect();
    let input = Input {
        request: Request {
            method: &head.method,
            request_uri: &head.target,
            proto: head.proto,
            content_length: head.content_length,
            host: &head.host,
            remote_addr: case.remote.as_bytes(),
            headers: &headers,
        },
        response: case.response,
        revision: &case.revision,
    };
    let mut out = b"previous line\n".to_vec();
    match template.render(&input, &mut out) {
        Ok(()) => Ours::Rendered(out[14..].to_vec()),
        Err(_) => {
            assert_eq!(
                out, b"previous line\n",
                "{}: render error must leave out unchanged",
                case.name
            );
            let mut line = Vec::new();
            fallback_line(&input, &mut line);
            Ours::Failed(line)
        }
    }
}

fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

fn go_available() -> bool {
    Command::new("go").arg("version").output().is_ok()
}

/// Runs the Go oracle once over all cases: name → (outcome, bytes).
fn run_oracle(cases: &[Case]) -> HashMap<String, (String, Vec<u8>)> {
    let mut input = String::new();
    for case in cases {
        input.push_str(&format!(
            "case {}\ntemplate {}\nrequest {}\nremote {}\ncode {}\nsize {}\nlatency {:016x}\nrevision {} {} {} {} {} {}\nend\n",
            case.name,
            hex(case.template.as_bytes()),
            hex(case.request),
            hex(case.remote.as_bytes()),
            case.response.code,
            case.response.size,
            case.response.latency_seconds.to_bits(),
            hex(case.revision.name.as_bytes()),
            hex(case.revision.namespace.as_bytes()),
            hex(case.revision.service.as_bytes()),
            hex(case.revision.configuration.as_bytes()),
            hex(case.revision.pod_name.as_bytes()),
            hex(case.revision.pod_ip.as_bytes()),
        ));
    }
    let oracle = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/oracle.go");
    let mut child = Command::new("nice")
        .args(["-n", "19", "go", "run", oracle])
        .env("GO111MODULE", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start go run");
    // Write from another thread: the oracle answers while it reads.
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("go run");
    writer.join().expect("writer thread").expect("write cases");
    assert!(output.status.success(), "oracle failed");
    let stdout = String::from_utf8(output.stdout).expect("oracle output is ASCII");
    let answers: HashMap<String, (String, Vec<u8>)> = stdout
        .lines()
        .map(|line| {
            let mut fields = line.split(' ');
            let name = fields.next().unwrap().to_string();
            let kind = fields.next().unwrap().to_string();
            let payload = unhex(fields.next().unwrap_or("").trim_start_matches('h'));
            (name, (kind, payload))
        })
        .collect();
    assert_eq!(
        answers.len(),
        cases.len(),
        "oracle answered every case once"
    );
    answers
}

#[test]
fn engine_matches_go_text_template_byte_for_byte() {
    assert!(
        go_available(),
        "`go` is not on PATH: the differential test needs it (apt-get install golang-go)"
    );
    let cases = corpus();
    let go = run_oracle(&cases);

    let refused_by_us: Vec<&str> = WE_REFUSE.iter().map(|(name, _)| *name).collect();
    let mut failures = Vec::new();
    let (mut rendered, mut exec_errors, mut parse_errors, mut deliberate) = (0, 0, 0, 0);
    for case in &cases {
        let (kind, expected) = &go[&case.name];
        let base = case.name.split('/').next().unwrap_or_default();
        let mine = ours(case);
        let verdict = match (kind.as_str(), &mine) {
            ("parse-error", Ours::Refused(_)) => {
                parse_errors += 1;
                Ok(())
            }
            ("parse-error", _) => Err(format!(
                "Go refuses the template ({}) but we accept it",
                show(expected)
            )),
            (_, Ours::Refused(_)) if refused_by_us.contains(&base) => {
                deliberate += 1;
                Ok(())
            }
            (_, _) if refused_by_us.contains(&base) => {
                Err("expected a deliberate refusal".to_string())
            }
            ("ok", Ours::Rendered(bytes)) if bytes == expected => {
                rendered += 1;
                Ok(())
            }
            ("exec-error", Ours::Failed(line)) if line == expected => {
                exec_errors += 1;
                Ok(())
            }
            (kind, Ours::Refused(message)) => Err(format!(
                "we refuse ({message}) but Go gives {kind}: {}",
                show(expected)
            )),
            (kind, Ours::Rendered(bytes)) | (kind, Ours::Failed(bytes)) => Err(format!(
                "Go {kind}:\n      {}\n    ours ({}):\n      {}",
                show(expected),
                if matches!(mine, Ours::Rendered(_)) {
                    "rendered"
                } else {
                    "fallback"
                },
                show(bytes)
            )),
        };
        if let Err(message) = verdict {
            failures.push(format!("  {}: {message}", case.name));
        }
    }
    eprintln!(
        "differential: {} cases; {rendered} rendered identically, {exec_errors} identical fallback lines, {parse_errors} refused by both, {deliberate} deliberately refused by us only",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from Go:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Builds random templates from a small grammar of the supported language
/// (and some of what is refused), deterministically.
struct Generator(u64);

impl Generator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }

    fn operand(&mut self, depth: u32) -> String {
        const LEAVES: &[&str] = &[
            ".Request.Method",
            ".Request.UserAgent",
            ".Request.Referer",
            ".Response.Code",
            ".Response.Size",
            ".Response.Latency",
            ".Request.ContentLength",
            ".Request.URL.Path",
            ".Request.URL",
            ".TraceID",
            ".Request.Header",
            "(.Request.Header.Values \"X-A\")",
            "(index .Request.Header \"X-A\")",
            "(.Request.Header.Get \"x-a\")",
            "\"a\"",
            "\"X-A\"",
            "\"\"",
            "0",
            "1",
            "-2",
            "2.5",
            "true",
            "false",
            "nil",
            ".Request.Proto",
            ".Request.ProtoMinor",
            ".Revision",
            ".Response",
            "\"<&'=\\\"\"",
            ".Request.URL.RawQuery",
            "1e6",
            "0x10",
        ];
        const FUNCS: &[&str] = &[
            "and", "or", "not", "len", "index", "slice", "eq", "ne", "lt", "le", "gt", "ge", "js",
            "html", "urlquery", "print", "println", "printf",
        ];
        const FORMATS: &[&str] = &[
            "\"%v\"",
            "\"%s\"",
            "\"%d\"",
            "\"%q\"",
            "\"%x\"",
            "\"%5.2f\"",
            "\"%-4v|%v\"",
            "\"%e\"",
            "\"%g\"",
            "\"%+q\"",
            "\"%05d\"",
            "\"%t\"",
            "\"%10s\"",
            "\"%.1s\"",
            "\"%X\"",
        ];
        if depth == 0 || self.next().is_multiple_of(3) {
            return self.pick(LEAVES).to_string();
        }
        let func = self.pick(FUNCS);
        let arity = match func {
            "not" | "len" => 1,
            "ne" | "lt" | "le" | "gt" | "ge" => 2,
            _ => 1 + (self.next() % 3) as usize,
        };
        let mut text = format!("({func}");
        if func == "printf" {
            text.push(' ');
            text.push_str(self.pick(FORMATS));
        }
        for _ in 0..arity {
            text.push(' ');
            text.push_str(&self.operand(depth - 1));
        }
        text.push(')');
        text
    }

    fn template(&mut self) -> String {
        let expression = self.operand(3);
        match self.next() % 7 {
            0 => format!("{{{{if {expression}}}}}yes{{{{else}}}}no{{{{end}}}}"),
            1 => format!("{{{{with {expression}}}}}[{{{{.}}}}]{{{{else}}}}none{{{{end}}}}"),
            2 => format!("{{{{range {expression}}}}}<{{{{.}}}}>{{{{else}}}}empty{{{{end}}}}"),
            3 => {
                let second = self.operand(1);
                format!(
                    "{{{{{expression} | {}}}}}",
                    if second.starts_with('(') {
                        second[1..second.len() - 1].to_string()
                    } else {
                        format!("print {second}")
                    }
                )
            }
            4 => format!("{{{{$v := {expression}}}}}{{{{$v}}}}|{{{{print $v}}}}"),
            _ => format!("{{{{{expression}}}}}"),
        }
    }
}

#[test]
fn generated_templates_match_go_or_are_refused() {
    assert!(
        go_available(),
        "`go` is not on PATH: the differential test needs it (apt-get install golang-go)"
    );
    let mut generator = Generator(0x2545_F491_4F6C_DD1D);
    let requests = [REQUESTS[1].1, REQUESTS[4].1, REQUESTS[11].1];
    let mut cases = Vec::new();
    for index in 0..700 {
        let template = generator.template();
        for (r, request) in requests.iter().enumerate() {
            let (code, size, latency) = RESPONSES[(index + r) % RESPONSES.len()];
            cases.push(Case {
                name: format!("generated{index}/{r}"),
                template: template.clone(),
                request,
                remote: "10.9.8.7:6543",
                response: Response {
                    code,
                    size,
                    latency_seconds: latency,
                },
                revision: revision(),
            });
        }
    }
    let go = run_oracle(&cases);
    let mut failures = Vec::new();
    let (mut same, mut refused_go_ok, mut refused_go_error) = (0, 0, 0);
    for case in &cases {
        let (kind, expected) = &go[&case.name];
        let verdict = match (kind.as_str(), ours(case)) {
            ("parse-error", Ours::Refused(_)) => Ok(()),
            ("parse-error", _) => Err(format!("Go refuses ({}) but we accept", show(expected))),
            ("ok", Ours::Refused(message)) => {
                if std::env::var_os("SHOW_REFUSALS").is_some() {
                    eprintln!("REFUSED {:?}: {message}", case.template);
                }
                refused_go_ok += 1;
                Ok(())
            }
            ("exec-error", Ours::Refused(_)) => {
                refused_go_error += 1;
                Ok(())
            }
            ("ok", Ours::Rendered(bytes)) | ("exec-error", Ours::Failed(bytes))
                if &bytes == expected =>
            {
                same += 1;
                Ok(())
            }
            (kind, Ours::Rendered(bytes)) | (kind, Ours::Failed(bytes)) => Err(format!(
                "Go {kind}: {}\n    ours: {}",
                show(expected),
                show(&bytes)
            )),
            (kind, Ours::Refused(_)) => Err(format!("unexpected Go outcome {kind}")),
        };
        if let Err(message) = verdict {
            failures.push(format!("  {} {:?}: {message}", case.name, case.template));
        }
    }
    eprintln!(
        "generated: {} cases; {same} identical; refused by us where Go renders: {refused_go_ok}, where Go fails when executing: {refused_go_error}",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} generated cases differ from Go:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
