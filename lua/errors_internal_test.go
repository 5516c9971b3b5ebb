package lua

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/ratebudget/ratebudget"
)

// TestClassifyTLS: TLS errors that can only come from a failed handshake are certain
// connection errors; a TLS error that can come after commands were sent (an alert
// about a record, one the client sent, a malformed record after the first) stays
// uncertain.
func TestClassifyTLS(t *testing.T) {
	conn, _ := net.Pipe()
	defer conn.Close()
	for _, tc := range []struct {
		name      string
		class     ratebudget.ErrorClass
		err       error
		uncertain bool
	}{
		{"verification", "connection", fmt.Errorf("dial: %w", &tls.CertificateVerificationError{Err: errors.New("x509: expired")}), false},
		{"first record not TLS", "connection", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake", Conn: conn}, false},
		{"client certificate required", "connection", &net.OpError{Op: "remote error", Err: tls.AlertError(116)}, false},
		{"unknown CA", "connection", &net.OpError{Op: "remote error", Err: tls.AlertError(48)}, false},
		{"bad record MAC", "connection", &net.OpError{Op: "remote error", Err: tls.AlertError(20)}, true},
		{"local bad record MAC", "connection", &net.OpError{Op: "local error", Err: tls.AlertError(116)}, true},
		{"oversized record", "other", tls.RecordHeaderError{Msg: "oversized record received"}, true},
	} {
		var se *ratebudget.StoreError
		if err := classify(tc.err); !errors.As(err, &se) || se.Class != tc.class || se.Uncertain != tc.uncertain {
			t.Errorf("%s: %v, want a %s StoreError, uncertain %v", tc.name, err, tc.class, tc.uncertain)
		}
	}
}
