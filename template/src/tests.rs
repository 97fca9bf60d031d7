//! Unit tests of the request-log template engine. The byte-for-byte
//! comparison with Go itself is `tests/go_differential.rs`; these pin the
//! behaviour case by case, including what the differential test cannot
//! reach (HTTP/2, Go 1.23's `else with`, refusal messages).

use super::*;

const DEFAULT_HEADERS: &[(&[u8], &[u8])] = &[
    (b"user-agent", b"curl/8 \"x\""),
    (b"Accept", b"*/*"),
    (b"x-b3-traceid", b"abc"),
    (b"X-A", b"1"),
    (b"x-a", b"2"),
];

fn revision() -> Revision {
    Revision {
        name: "hello-00001".into(),
        namespace: "default".into(),
        service: "hello".into(),
        configuration: "hello-config".into(),
        pod_name: "hello-pod".into(),
        pod_ip: "10.0.0.7".into(),
    }
}

fn input<'a>(revision: &'a Revision, headers: &'a [(&'a [u8], &'a [u8])]) -> Input<'a> {
    Input {
        request: Request {
            method: b"GET",
            request_uri: b"/a?b=c",
            proto: Proto::Http11,
            content_length: 0,
            host: b"example.com",
            remote_addr: b"10.0.0.1:1234",
            headers,
        },
        response: Response {
            code: 200,
            size: 12,
            latency_seconds: 0.000123,
        },
        revision,
    }
}

fn render_with(text: &str, input: &Input<'_>) -> std::result::Result<String, String> {
    let template = Template::parse(text).map_err(|error| format!("parse: {error}"))?;
    let mut out = Vec::new();
    template
        .render(input, &mut out)
        .map_err(|error| format!("render: {error}"))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn render(text: &str) -> String {
    let revision = revision();
    render_with(text, &input(&revision, DEFAULT_HEADERS))
        .unwrap_or_else(|error| panic!("{text:?}: {error}"))
}

fn check_table(cases: &[(&str, &str)]) {
    for (text, expected) in cases {
        assert_eq!(render(text), format!("{expected}\n"), "template {text:?}");
    }
}

#[test]
fn knative_default_templates_render_like_knative() {
    assert_eq!(
        render(KNATIVE_1_18_DEFAULT),
        "{\"httpRequest\": {\"requestMethod\": \"GET\", \"requestUrl\": \"/a?b\\u003Dc\", \"requestSize\": \"0\", \"status\": 200, \"responseSize\": \"12\", \"userAgent\": \"curl/8 \\\"x\\\"\", \"remoteIp\": \"10.0.0.1:1234\", \"serverIp\": \"10.0.0.7\", \"referer\": \"\", \"latency\": \"0.000123s\", \"protocol\": \"HTTP/1.1\"}, \"traceId\": \"[abc]\"}\n"
    );
    assert!(render(KNATIVE_1_21_DEFAULT)
        .ends_with("\"protocol\": \"HTTP/1.1\"}, \"traceId\": \"abc\"}\n"));
    let revision = revision();
    let no_trace = render_with(KNATIVE_1_18_DEFAULT, &input(&revision, &[])).unwrap();
    assert!(no_trace.ends_with("\"traceId\": \"[]\"}\n"), "{no_trace}");
}

#[test]
fn default_templates_read_only_the_headers_they_use() {
    let names = |names: &[&str]| HeadersRead::Names(names.iter().map(|n| n.to_string()).collect());
    let cases: &[(&str, HeadersRead)] = &[
        (
            KNATIVE_1_18_DEFAULT,
            names(&["Referer", "User-Agent", "X-B3-Traceid"]),
        ),
        (
            KNATIVE_1_21_DEFAULT,
            names(&["Referer", "Traceparent", "User-Agent", "X-B3-Traceid"]),
        ),
        ("{{.Request.Method}}", HeadersRead::None),
        (
            r#"{{.Request.Header.Get "cache-control"}}"#,
            names(&["Cache-Control", "Pragma"]),
        ),
        (r#"{{index .Request.Header "x-lower"}}"#, HeadersRead::None),
        (r#"{{.Request.Header.Values "x-a" | len}}"#, names(&["X-A"])),
        ("{{.Request.Header}}", HeadersRead::All),
        ("{{len .Request.Header}}", HeadersRead::All),
        ("{{if .Request.Header}}x{{end}}", HeadersRead::All),
        ("{{range .Request.Header}}x{{end}}", HeadersRead::All),
        (
            r#"{{.Request.Header.Get .Request.Method}}"#,
            HeadersRead::All,
        ),
        (r#"{{$h := .Request.Header}}{{$h.Get "A"}}"#, names(&["A"])),
    ];
    for (text, expected) in cases {
        let template = Template::parse(text).unwrap();
        assert_eq!(template.headers_read(), expected, "{text}");
    }
    let read = names(&["X-B3-Traceid", "Weird Name"]);
    assert!(read.wants(b"x-b3-TRACEID"));
    assert!(read.wants(b"Weird Name"));
    assert!(!read.wants(b"weird name"));
    assert!(!read.wants(b"X-B3-Spanid"));
    assert!(HeadersRead::All.wants(b"anything"));
    assert!(!HeadersRead::None.wants(b"anything"));
}

#[test]
fn trim_markers_remove_adjacent_whitespace_like_go() {
    check_table(&[
        ("a  {{- .Request.Method -}}  b", "aGETb"),
        ("a \n\t {{- .Request.Method}} b", "aGET b"),
        ("a {{.Request.Method -}} \r\n b", "a GETb"),
        ("a {{-3}} b", "a -3 b"),
        ("a {{- 3}} b", "a3 b"),
        ("a {{/* c */}} b", "a  b"),
        ("a {{- /* c */ -}} b", "ab"),
        ("x{{- \n.Request.Method\n -}}y", "xGETy"),
        ("{{.Request.Method  -}}  z", "GETz"),
    ]);
    assert_eq!(render("{{- /* only */ -}}"), "");
    assert_eq!(render("{{.Request.Method -}}"), "GET");
}

#[test]
fn fields_of_the_data_model_print_like_go() {
    check_table(&[
        (
            "{{.Request.Method}} {{.Request.RequestURI}} {{.Request.Proto}}",
            "GET /a?b=c HTTP/1.1",
        ),
        (
            "{{.Request.ProtoMajor}}.{{.Request.ProtoMinor}} {{.Request.ContentLength}}",
            "1.1 0",
        ),
        (
            "{{.Request.Host}} {{.Request.RemoteAddr}}",
            "example.com 10.0.0.1:1234",
        ),
        (
            "{{.Request.UserAgent}}|{{.Request.Referer}}",
            "curl/8 \"x\"|",
        ),
        (
            "{{.Response.Code}} {{.Response.Size}} {{.Response.Latency}}",
            "200 12 0.000123",
        ),
        (
            "{{.Revision.Name}} {{.Revision.Namespace}} {{.Revision.Service}} {{.Revision.Configuration}} {{.Revision.PodName}} {{.Revision.PodIP}}",
            "hello-00001 default hello hello-config hello-pod 10.0.0.7",
        ),
        (
            "{{.Response}}|{{print .Response}}|{{js .Revision}}",
            "{200 12 0.000123}|&{200 12 0.000123}|{hello-00001 default hello hello-config hello-pod 10.0.0.7}",
        ),
        (
            "{{.Request.URL}}|{{.Request.URL.Path}}|{{.Request.URL.RawQuery}}|{{.Request.URL.IsAbs}}",
            "/a?b=c|/a|b=c|false",
        ),
        (
            "{{.Request.Header}}",
            "map[Accept:[*/*] User-Agent:[curl/8 \"x\"] X-A:[1 2] X-B3-Traceid:[abc]]",
        ),
        ("{{.TraceID}}", "abc"),
        (
            "{{$.Request.Method}}{{with .Request}}{{.Method}}{{end}}",
            "GETGET",
        ),
    ]);
}

#[test]
fn http2_requests_report_version_2_and_keep_their_headers() {
    let revision = revision();
    let headers: &[(&[u8], &[u8])] = &[
        (b"host", b"h2.example"),
        (b"pragma", b"no-cache"),
        (b"content-length", b"5"),
    ];
    let mut input = input(&revision, headers);
    input.request.proto = Proto::Http2;
    input.request.content_length = -1;
    let output = render_with(
        "{{.Request.Proto}} {{.Request.ProtoMajor}} {{.Request.ProtoMinor}} {{.Request.ContentLength}} {{.Request.Header}}",
        &input,
    );
    assert_eq!(
        output.unwrap(),
        "HTTP/2.0 2 0 -1 map[Content-Length:[5] Host:[h2.example] Pragma:[no-cache]]\n"
    );
    input.request.proto = Proto::Http11;
    let output = render_with("{{.Request.Header}}", &input);
    assert_eq!(
        output.unwrap(),
        "map[Cache-Control:[no-cache] Pragma:[no-cache]]\n"
    );
}

#[test]
fn http2_header_map_follows_go_http2_server() {
    let revision = revision();
    let headers: &[(&[u8], &[u8])] = &[
        (b"cookie", b"a=1"),
        (b"expect", b"100-continue"),
        (b"cookie", b"b=2"),
        (b"trailer", b"x-checksum"),
        (b"transfer-encoding", b"chunked"),
    ];
    let mut input = input(&revision, headers);
    input.request.proto = Proto::Http2;
    let text = r#"{{.Request.Header}}|{{.Request.Header.Get "Cookie"}}|{{len (.Request.Header.Values "cookie")}}"#;
    assert_eq!(
        render_with(text, &input).unwrap(),
        "map[Cookie:[a=1; b=2] Transfer-Encoding:[chunked]]|a=1; b=2|1\n"
    );
    input.request.proto = Proto::Http11;
    input.request.content_length = -1;
    assert_eq!(
        render_with(text, &input).unwrap(),
        "map[Cookie:[a=1 b=2] Expect:[100-continue]]|a=1|2\n"
    );
}

#[test]
fn functions_behave_like_go_builtins() {
    check_table(&[
        (
            r#"{{js "<a href='x'>&=\"\\\x01é\u2028"}}"#,
            r#"\u003Ca href\u003D\'x\'\u003E\u0026\u003D\"\\\u0001é\u2028"#,
        ),
        (
            r#"{{html "<a href='x'>&\"\x00"}}"#,
            "&lt;a href=&#39;x&#39;&gt;&amp;&#34;\u{FFFD}",
        ),
        (r#"{{urlquery "a b&c=d/é~"}}"#, "a+b%26c%3Dd%2F%C3%A9~"),
        (r#"{{js 1 2}}|{{js "a" 1 "b"}}|{{html}}"#, "1 2|a1b|"),
        (
            r#"{{print 1 2 "a" 3 true false}}|{{println 1 "a"}}"#,
            "1 2a3 true false|1 a\n",
        ),
        (
            r#"{{printf "%s-%d-%5.1f-%q-%x" "a" 7 2.25 "q" 255}}"#,
            "a-7-  2.2-\"q\"-ff",
        ),
        (
            r#"{{len "héllo"}} {{len .Request.Header}} {{len (index .Request.Header "X-A")}}"#,
            "6 4 2",
        ),
        (
            r#"{{index .Request.Header "X-A" 1}} {{index "abc" 1}} {{index .Request.Header "x-a"}}"#,
            "2 98 []",
        ),
        (
            r#"{{slice "abcdef" 1 3}} {{slice "abc" 1}} {{slice "abc"}}"#,
            "bc bc abc",
        ),
        (
            r#"{{and 1 0 2}} {{and 1 2}} {{or 0 "" "x"}} {{or 0 ""}} {{not 0}} {{not "a"}}"#,
            "0 2 x  true false",
        ),
        (
            r#"{{eq 1 2 3 1}} {{eq "a" "b"}} {{ne 1 2}} {{lt 1 2}} {{le 2 2}} {{gt "b" "a"}} {{ge 1.5 2.5}}"#,
            "true false true true true true false",
        ),
        (
            r#"{{eq (index "a" 0) 97}} {{lt -1 (index "a" 0)}}"#,
            "true true",
        ),
        (
            r#"{{.Request.Header.Get "X-A"}} {{.Request.Header.Values "x-a"}} {{.Request.Header.Get "none"}}"#,
            "1 [1 2] ",
        ),
        (
            r#"{{eq nil nil}} {{eq 1 nil}} {{and nil 1}} {{print nil}} {{js nil}} {{printf "%v" nil}}"#,
            "true false <no value> <nil> \\u003Cno value\\u003E <nil>",
        ),
    ]);
}

#[test]
fn numbers_print_like_fmt_v() {
    let revision = revision();
    let cases: &[(f64, &str)] = &[
        (0.0, "0"),
        (-0.0, "-0"),
        (1e-05, "1e-05"),
        (0.000123, "0.000123"),
        (0.5, "0.5"),
        (12.25, "12.25"),
        (100000.0, "100000"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (1e21, "1e+21"),
        (0.1 + 0.2, "0.30000000000000004"),
        (5e-324, "5e-324"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
    ];
    for &(latency, expected) in cases {
        let mut input = input(&revision, &[]);
        input.response.latency_seconds = latency;
        let output = render_with("{{.Response.Latency}}", &input).unwrap();
        assert_eq!(output, format!("{expected}\n"), "latency {latency:e}");
    }
    check_table(&[
        (
            "{{1.5}} {{1e3}} {{0x1F}} {{017}} {{0o17}} {{0b101}} {{-5}} {{+7}} {{'a'}} {{.5}}",
            "1.5 1000 31 15 15 5 -5 7 97 0.5",
        ),
        (
            r#"{{printf "%e|%.2E|%g|%.3g|%08.3f|%+.1f|% .0f" 1234.5678 0.000123 1e21 1234.5 -3.14159 2.25 2.5}}"#,
            "1.234568e+03|1.23E-04|1e+21|1.23e+03|-003.142|+2.2| 2",
        ),
        (
            r#"{{printf "%05d|%-5d|%+d|%x|%X|%08x" -42 42 5 -255 255 48879}}"#,
            "-0042|42   |+5|-ff|FF|0000beef",
        ),
        (
            r#"{{printf "%t|%5v|%-5v|%q|%+q|%.2s|%5.1q" true 1 "ab" "é\n" "é" "héllo" "xyz"}}"#,
            "true|    1|ab   |\"é\\n\"|\"\\u00e9\"|hé|  \"x\"",
        ),
        ("{{printf \"100%%\"}}", "100%"),
    ]);
}

#[test]
fn control_structures_and_variables_follow_go_scoping() {
    check_table(&[
        (
            r#"{{if eq .Response.Code 200}}ok{{else if eq .Response.Code 500}}err{{else}}other{{end}}"#,
            "ok",
        ),
        (r#"{{if .Request.Referer}}ref{{else}}none{{end}}"#, "none"),
        (
            r#"{{with .Request.UserAgent}}[{{.}}]{{end}}{{with .Request.Referer}}x{{else}}y{{end}}"#,
            "[curl/8 \"x\"]y",
        ),
        (
            r#"{{range $i, $v := .Request.Header.Values "X-A"}}{{$i}}={{$v}};{{end}}"#,
            "0=1;1=2;",
        ),
        (
            r#"{{range .Request.Header.Values "X-A"}}<{{.}}>{{else}}empty{{end}}{{range .Request.Header.Values "Q"}}x{{else}}empty{{end}}"#,
            "<1><2>empty",
        ),
        (
            r#"{{range $k, $v := .Request.Header}}{{$k}}{{len $v}} {{end}}"#,
            "Accept1 User-Agent1 X-A2 X-B3-Traceid1 ",
        ),
        (
            r#"{{range $v := .Request.Header.Values "Q"}}{{else}}{{$v}}{{end}}"#,
            "[]",
        ),
        (
            r#"{{range $i, $v := .Request.Header.Values "X-A"}}{{if eq $i 0}}{{continue}}{{end}}{{$v}}{{break}}{{end}}"#,
            "2",
        ),
        (
            r#"{{$x := 1}}{{if true}}{{$x := 2}}{{$x}}{{end}}{{$x}}"#,
            "21",
        ),
        (r#"{{$x := 1}}{{if true}}{{$x = 2}}{{end}}{{$x}}"#, "2"),
        (
            r#"{{$x := "a"}}{{range .Request.Header.Values "X-A"}}{{$x = .}}{{end}}{{$x}}"#,
            "2",
        ),
        (
            r#"{{with $m := .Request.Method}}{{$m}}{{end}}{{if $c := .Response.Code}}{{$c}}{{end}}"#,
            "GET200",
        ),
        (
            r#"{{.Request.Method | printf "%s-%s" "a"}} {{"x-a" | .Request.Header.Get}} {{.Response.Code | eq 200}}"#,
            "a-GET 1 true",
        ),
        (
            r#"{{(.Request.Header).Get "accept"}} {{(print "a" "b") | len}}"#,
            "*/* 2",
        ),
        // Go 1.23 added {{else with}}; Knative 1.18 and later build with it.
        (
            r#"{{with .Request.Referer}}r{{else with .Request.UserAgent}}u{{else}}n{{end}}"#,
            "u",
        ),
    ]);
}

#[test]
fn execution_errors_leave_output_unchanged_and_fallback_matches_knative() {
    let revision = revision();
    let input = input(&revision, DEFAULT_HEADERS);
    let cases = [
        r#"{{index .Request.Header "X-A" 5}}"#,
        "{{slice .Request.Method 2 1}}",
        "{{index .Request.Method 3}}",
        r#"{{eq (or .Request.UserAgent 0) 1}}"#,
        r#"{{lt (or .Request.UserAgent 0) 1}}"#,
    ];
    for text in cases {
        let template = Template::parse(text).unwrap();
        let mut out = b"kept".to_vec();
        assert!(template.render(&input, &mut out).is_err(), "{text}");
        assert_eq!(out, b"kept");
    }
    let mut line = Vec::new();
    fallback_line(&input, &mut line);
    assert_eq!(
        String::from_utf8(line).unwrap(),
        "Invalid request log template: method: GET, response code: 200, latency: 0.000123, url: /a?b=c\n"
    );
}

#[test]
fn parse_refusals_say_where_and_what() {
    let cases: &[(&str, &str)] = &[
        (
            "{{.Request.Foo}}",
            "unknown or unsupported field Foo of .Request (known: Method, RequestURI",
        ),
        ("{{.Request.Body}}", "field Body of .Request"),
        (
            "{{.Request.Header.Accept}}",
            "write (index .Request.Header \"Accept\")",
        ),
        ("{{.}}", "printing the template data"),
        ("{{.Request}}", "printing *http.Request is not supported"),
        (r#"{{printf "%T" 1}}"#, "printf verb %T"),
        (r#"{{printf "%d"}}"#, "1 verbs but 0 arguments"),
        ("{{printf .Request.Method}}", "not a string literal"),
        (
            r#"{{eq .Response.Code "200"}}"#,
            "eq compares int with string",
        ),
        ("{{len 3}}", "len of int"),
        ("{{nil}}", "nil is not a command"),
        (r#"{{define "x"}}{{end}}"#, "define is not supported"),
        (r#"{{template "x"}}"#, "template is not supported"),
        ("{{block \"x\" .}}{{end}}", "block is not supported"),
        ("{{call .Request.Method}}", "\"call\" is not supported"),
        ("{{range .Request.Method}}{{end}}", "range over string"),
        (
            "{{print ($x := 1)}}",
            "declaring a variable inside parentheses",
        ),
        ("{{1_000}}", "underscores"),
        ("{{$x := 1}}{{$x = \"a\"}}", "keep one type"),
        ("{{.Request.Method", "unclosed action"),
        ("{{end}}", "unexpected {{end}}"),
        ("{{$x}}", "undefined variable \"$x\""),
        ("{{nosuch}}", "function \"nosuch\" not defined"),
        (
            "{{.Request.Method | 3}}",
            "non executable command in pipeline stage 2",
        ),
        ("{{break}}", "{{break}} outside {{range}}"),
        ("{{/* x", "unclosed comment"),
        ("{{if .Request.Method}}", "missing {{end}}"),
        ("{{$é := 1}}", "non-ASCII"),
        ("{{.Request.Method 1}}", "not a method that takes arguments"),
        ("{{.Request.Header.Get}}", "takes one argument"),
        ("{{1i}}", "imaginary"),
    ];
    for (text, expected) in cases {
        match Template::parse(text) {
            Ok(_) => panic!("{text:?} was accepted"),
            Err(error) => assert!(
                error.to_string().contains(expected),
                "{text:?}: {error} does not mention {expected:?}"
            ),
        }
    }
    let error = Template::parse("ok\nline two {{.Request.Nope}}").unwrap_err();
    assert_eq!((error.line, error.column), (2, 12));
    assert!(error
        .to_string()
        .starts_with("request log template, line 2 column 12: "));
}

#[test]
fn template_is_shareable_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Template>();
    assert_send_sync::<TemplateError>();
    assert_send_sync::<RenderError>();
}

/// A small deterministic generator for the brute-force test.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

#[test]
fn random_and_mutated_templates_never_panic() {
    const PIECES: &[&str] = &[
        "{{",
        "}}",
        "{{-",
        "-}}",
        " ",
        "\n",
        ".",
        "$",
        "$x",
        ":=",
        "=",
        "|",
        "(",
        ")",
        "\"",
        "`",
        "'",
        "/*",
        "*/",
        "if",
        "else",
        "end",
        "range",
        "with",
        "break",
        "continue",
        "nil",
        "true",
        "1",
        "-1",
        "1.5e3",
        "0x",
        "index",
        "slice",
        "len",
        "and",
        "or",
        "not",
        "eq",
        "lt",
        "js",
        "html",
        "urlquery",
        "print",
        "println",
        "printf",
        "\"%v\"",
        "\"%5.2f\"",
        "\"%q\"",
        ".Request",
        ".Method",
        ".Header",
        ".Get",
        "\"X-A\"",
        ".Response",
        ".Latency",
        ".Code",
        ".URL",
        ".Path",
        ".TraceID",
        ".Revision",
        "é",
        "\\",
        ",",
        "$i",
        "$v",
        "{",
        "}",
        "%",
        "\u{0}",
    ];
    let seeds = [
        KNATIVE_1_18_DEFAULT,
        KNATIVE_1_21_DEFAULT,
        "{{range $i, $v := .Request.Header}}{{$i}}{{index $v 0}}{{end}}",
        "{{with $x := .Request.Header.Get \"X-A\"}}{{printf \"%q %v\" $x .}}{{else}}{{slice \"ab\" 1}}{{end}}",
        "{{if and .Request.UserAgent (eq .Response.Code 200)}}{{.Request.URL.Path | urlquery}}{{end}}",
    ];
    let revision = revision();
    let inputs = [input(&revision, DEFAULT_HEADERS), input(&revision, &[])];
    let mut random = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut accepted = 0;
    for round in 0..4000 {
        let mut text = seeds[round % seeds.len()].to_string();
        if round % 3 == 0 {
            text.clear();
        }
        for _ in 0..1 + random.below(6) {
            let piece = PIECES[random.below(PIECES.len())];
            let mut at = random.below(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            match random.below(3) {
                0 => text.insert_str(at, piece),
                1 => {
                    let mut end = (at + random.below(8)).min(text.len());
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.replace_range(at..end, piece);
                }
                _ => {
                    let mut end = (at + 1 + random.below(4)).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(at..end.min(text.len()), "");
                }
            }
        }
        if let Ok(template) = Template::parse(&text) {
            accepted += 1;
            for input in &inputs {
                let mut out = Vec::new();
                if template.render(input, &mut out).is_err() {
                    fallback_line(input, &mut out);
                }
            }
        }
    }
    assert!(accepted > 100, "only {accepted} mutated templates parsed");
}

#[test]
fn integers_print_as_go_prints_them_up_to_the_edges_of_i64() {
    for (value, text) in [
        (0, "0"),
        (7, "7"),
        (-1, "-1"),
        (10, "10"),
        (1234, "1234"),
        (-1000, "-1000"),
        (i64::MAX, "9223372036854775807"),
        (i64::MIN, "-9223372036854775808"),
    ] {
        let mut out = b"x".to_vec();
        gofmt::push_int(&mut out, value);
        assert_eq!(out, [b"x", text.as_bytes()].concat(), "{value}");
    }
}

#[test]
fn js_copies_plain_runs_and_escapes_what_go_escapes_between_them() {
    let cases: [(&[u8], &[u8]); 9] = [
        (b"", b""),
        (b"/plain/path?x", b"/plain/path?x"),
        (b"a=b&c<d>", br"a\u003Db\u0026c\u003Cd\u003E"),
        (br#""'\"#, br#"\"\'\\"#),
        (b"\x01tab\x1f", br"\u0001tab\u001F"),
        ("café ok".as_bytes(), "café ok".as_bytes()),
        ("a\u{2028}b".as_bytes(), br"a\u2028b"),
        (b"\xffz", b"\xffz"),
        (b"\x7f", b"\x7f"),
    ];
    for (input, escaped) in cases {
        let mut out = b"x".to_vec();
        gofmt::js_escape(&mut out, input);
        assert_eq!(
            out,
            [b"x", escaped].concat(),
            "{}",
            String::from_utf8_lossy(input)
        );
    }
}
