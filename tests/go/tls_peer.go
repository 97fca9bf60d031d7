// A TLS peer with Knative's own settings, in Go's crypto/tls (tests/tls_go_peers.rs).
//
//	go run tls_peer.go client ADDR CA_FILE NAMESPACE [tls12]
//	    dials ADDR as Knative's activator dials a queue-proxy (pkg/activator/certificate:
//	    TLS 1.3 minimum, ServerName data-plane.knative.dev, only CA_FILE trusted, the leaf's DNS
//	    names must hold kn-user-NAMESPACE), sends GET / over HTTP/1.1, prints the status line and
//	    X-Backend; "tls12" caps the client at TLS 1.2 instead.
//	go run tls_peer.go server CERT KEY [ADDR]
//	    serves TLS as Knative's queue-proxy does (TLS 1.3 minimum, the pair by GetCertificate,
//	    net/http's ALPN), answering every request "hello from go" with X-Backend: go, the
//	    protocol, the server name the client sent and the X-Forwarded-Proto it got; prints
//	    "listening on ADDR" once it listens on ADDR, by default a free loopback port.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

func main() {
	switch os.Args[1] {
	case "client":
		client(os.Args[2], os.Args[3], os.Args[4], len(os.Args) > 5 && os.Args[5] == "tls12")
	case "server":
		addr := "127.0.0.1:0"
		if len(os.Args) > 4 {
			addr = os.Args[4]
		}
		server(os.Args[2], os.Args[3], addr)
	}
}

func client(addr, caFile, namespace string, tls12 bool) {
	pem, err := os.ReadFile(caFile)
	check(err)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		fail("no CA in " + caFile)
	}
	want := "kn-user-" + strings.ToLower(namespace)
	config := &tls.Config{
		RootCAs:    pool,
		ServerName: "data-plane.knative.dev",
		MinVersion: tls.VersionTLS13,
		// Upstream's verifySAN (tls_context.go).
		VerifyConnection: func(state tls.ConnectionState) error {
			for _, name := range state.PeerCertificates[0].DNSNames {
				if name == want {
					return nil
				}
			}
			return fmt.Errorf("san %q does not have a matching name in %v", want, state.PeerCertificates[0].DNSNames)
		},
	}
	if tls12 {
		config.MinVersion = tls.VersionTLS12
		config.MaxVersion = tls.VersionTLS12
	}
	transport := &http.Transport{
		ForceAttemptHTTP2: false,
		DialTLSContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			dialer := &tls.Dialer{Config: config.Clone()}
			return dialer.DialContext(ctx, network, addr)
		},
	}
	response, err := (&http.Client{Transport: transport}).Get("https://" + addr + "/")
	check(err)
	fmt.Printf("%s %s\nx-backend: %s\n", response.Proto, response.Status, response.Header.Get("X-Backend"))
}

func server(certFile, keyFile, addr string) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	check(err)
	listener, err := net.Listen("tcp", addr)
	check(err)
	config := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return &pair, nil
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", "go")
		w.Header().Set("X-Http-Version", r.Proto)
		w.Header().Set("X-Tls-Server-Name", r.TLS.ServerName)
		w.Header().Set("X-Seen-Forwarded-Proto", r.Header.Get("X-Forwarded-Proto"))
		fmt.Fprint(w, "hello from go\n")
	})
	srv := &http.Server{Handler: handler, TLSConfig: config}
	fmt.Printf("listening on %s\n", listener.Addr())
	check(srv.ServeTLS(listener, "", ""))
}

func check(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(why string) {
	fmt.Fprintln(os.Stderr, why)
	os.Exit(1)
}
