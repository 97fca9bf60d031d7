// Command oracle renders Knative request-log templates with Go's own
// text/template and net/http, for the differential test in
// ../go_differential.rs. Standard library only.
//
// Input (stdin), one case after another, every byte string written as "h"
// and its hex encoding:
//
//	case NAME
//	template HEX
//	request HEX        raw HTTP/1.x request head, read with http.ReadRequest
//	remote HEX         RemoteAddr
//	code INT
//	size INT
//	latency HEX        the float64's IEEE-754 bits, 16 hex digits
//	revision HEX HEX HEX HEX HEX HEX
//	end
//
// Output, one line per case: NAME then one of
//
//	ok HEX             what Knative writes: the rendered line
//	exec-error HEX     execution failed; HEX is Knative's fallback line
//	parse-error HEX    template.Parse refused the template (the message)
//	bad-request HEX    http.ReadRequest refused the request (the message)
package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/template"
)

// The types Knative passes to the template (pkg/http/request_log.go).
type RequestLogRevision struct {
	Name          string
	Namespace     string
	Service       string
	Configuration string
	PodName       string
	PodIP         string
}

type RequestLogResponse struct {
	Code    int
	Size    int
	Latency float64
}

type RequestLogTemplateInput struct {
	Request  *http.Request
	Response *RequestLogResponse
	Revision *RequestLogRevision
	TraceID  string
}

// extractTraceID follows Knative's ExtractTraceID.
func extractTraceID(h http.Header) string {
	if tp := h.Get("Traceparent"); tp != "" {
		parts := strings.SplitN(tp, "-", 3)
		if len(parts) >= 2 {
			return parts[1]
		}
	}
	if b3 := h.Get("X-B3-Traceid"); b3 != "" {
		return b3
	}
	return ""
}

type testCase struct {
	name, template, request, remote string
	code, size                      int
	latency                         float64
	revision                        RequestLogRevision
}

// mustHex decodes "h" followed by hex digits (the "h" keeps empty values
// from disappearing between spaces).
func mustHex(s string) string {
	b, err := hex.DecodeString(strings.TrimPrefix(s, "h"))
	if err != nil {
		panic(err)
	}
	return string(b)
}

func run(c *testCase, out *bufio.Writer) {
	emit := func(kind, payload string) {
		fmt.Fprintf(out, "%s %s %s\n", c.name, kind, hex.EncodeToString([]byte(payload)))
	}
	text := c.template
	// As Knative's SetTemplate does.
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	t, err := template.New("requestLog").Parse(text)
	if err != nil {
		emit("parse-error", err.Error())
		return
	}
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(c.request)))
	if err != nil {
		emit("bad-request", err.Error())
		return
	}
	req.RemoteAddr = c.remote
	in := &RequestLogTemplateInput{
		Request:  req,
		Response: &RequestLogResponse{Code: c.code, Size: c.size, Latency: c.latency},
		Revision: &c.revision,
		TraceID:  extractTraceID(req.Header),
	}
	var w bytes.Buffer
	if err := t.Execute(&w, in); err != nil {
		var fallback bytes.Buffer
		// As Knative's RequestLogHandler.write does.
		fmt.Fprintf(&fallback, "Invalid request log template: method: %v, response code: %v, latency: %v, url: %v\n",
			in.Request.Method, in.Response.Code, in.Response.Latency, in.Request.URL)
		emit("exec-error", fallback.String())
		return
	}
	emit("ok", w.String())
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var c *testCase
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) == 0 {
			continue
		}
		arg := func(i int) string {
			if i < len(fields) {
				return fields[i]
			}
			return ""
		}
		switch fields[0] {
		case "case":
			c = &testCase{name: arg(1)}
		case "template":
			c.template = mustHex(arg(1))
		case "request":
			c.request = mustHex(arg(1))
		case "remote":
			c.remote = mustHex(arg(1))
		case "code":
			c.code, _ = strconv.Atoi(arg(1))
		case "size":
			c.size, _ = strconv.Atoi(arg(1))
		case "latency":
			bits, _ := strconv.ParseUint(arg(1), 16, 64)
			c.latency = math.Float64frombits(bits)
		case "revision":
			c.revision = RequestLogRevision{mustHex(arg(1)), mustHex(arg(2)), mustHex(arg(3)),
				mustHex(arg(4)), mustHex(arg(5)), mustHex(arg(6))}
		case "end":
			run(c, out)
		}
	}
}
