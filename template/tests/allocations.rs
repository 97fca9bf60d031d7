//! Rendering Knative's default templates must not allocate (the proxy does
//! it for every request when request logs are on); checked with a counting
//! allocator that counts only on the rendering thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kactivator_template::{
    Input, Proto, Request, Response, Revision, Template, KNATIVE_1_18_DEFAULT, KNATIVE_1_21_DEFAULT,
};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            COUNT.with(|count| count.set(count.get() + 1));
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn rendering_the_default_templates_into_a_reused_buffer_does_not_allocate() {
    let revision = Revision {
        pod_ip: "10.0.0.7".into(),
        ..Revision::default()
    };
    let headers: &[(&[u8], &[u8])] = &[
        (b"user-agent", b"Mozilla/5.0 \"quoted\" <x>"),
        (b"referer", b"https://example.com/?a=b"),
        (
            b"traceparent",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        (b"x-b3-traceid", b"80f198ee56343ba864fe8b2a57d3eff7"),
    ];
    let input = Input {
        request: Request {
            method: b"GET",
            request_uri: b"/path?x=1&y=<2>",
            proto: Proto::Http11,
            content_length: 0,
            host: b"example.com",
            remote_addr: b"10.1.2.3:4567",
            headers,
        },
        response: Response {
            code: 200,
            size: 1234,
            latency_seconds: 0.001234,
        },
        revision: &revision,
    };
    for text in [KNATIVE_1_18_DEFAULT, KNATIVE_1_21_DEFAULT] {
        let template = Template::parse(text).unwrap();
        let mut out = Vec::with_capacity(4096);
        COUNTING.with(|counting| counting.set(true));
        for _ in 0..100 {
            out.clear();
            template.render(&input, &mut out).unwrap();
        }
        COUNTING.with(|counting| counting.set(false));
        let allocations = COUNT.with(|count| count.replace(0));
        assert_eq!(allocations, 0, "{}", String::from_utf8_lossy(&out));
    }
}
