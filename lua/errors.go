package lua

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
)

// classify wraps err, returned by a script call that may have reached the server, as a
// *ratebudget.StoreError. Uncertain is false only when the script surely did not spend:
// it was never sent, or the server answered with an error. go-redis clients never
// re-send a script call (see onceCmd), so err is that of the only attempt that may have
// run; a redirect followed (MOVED, ASK) had not run.
func classify(err error) error {
	se := &ratebudget.StoreError{Class: ratebudget.ClassOther, Uncertain: true, Err: err}
	var opErr *net.OpError
	var netErr net.Error
	var rErr redis.Error
	var ns notSent
	switch {
	case errors.As(err, &ns):
		se.Class, se.Uncertain = ratebudget.ClassCanceled, false
		if errors.Is(err, context.DeadlineExceeded) {
			se.Class = ratebudget.ClassTimeout
		}
	case errors.Is(err, redis.Nil):
		se.Class = ratebudget.ClassReply // the script ran but its reply is unusable
	case errors.As(err, &opErr) && opErr.Op == "dial":
		// No connection, so nothing was sent, even when the dial ran out of time (a
		// blackholed address): checked before the context errors a dial timeout matches.
		se.Class, se.Uncertain = ratebudget.ClassConnection, false
	case handshakeFailed(err):
		se.Class, se.Uncertain = ratebudget.ClassConnection, false
	case errors.Is(err, context.Canceled):
		se.Class = ratebudget.ClassCanceled
	case errors.Is(err, context.DeadlineExceeded):
		se.Class = ratebudget.ClassTimeout
	case errors.Is(err, redis.ErrPoolTimeout):
		// No connection was free: the script was never sent.
		se.Class, se.Uncertain = ratebudget.ClassTimeout, false
	case errors.Is(err, redis.ErrClosed):
		se.Class, se.Uncertain = ratebudget.ClassConnection, false
	case errors.As(err, &rErr):
		// The server answered with an error: the script did not spend (it validates
		// before its first write, and an OOM refusal comes at the first write).
		se.Class, se.Uncertain = ratebudget.ClassServer, false
	case errors.As(err, &netErr) && netErr.Timeout():
		se.Class = ratebudget.ClassTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed), errors.As(err, &opErr):
		se.Class = ratebudget.ClassConnection
	}
	return se
}

// notSent is the error of a call held back because its context had ended first.
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// handshakeFailed reports whether err says that a TLS handshake failed, so that the
// connection never carried a command: the server's certificate was not accepted, the
// server's first reply was not TLS, or the server refused the handshake with an alert
// it sends only then (RFC 8446, section 6.2: e.g. a client certificate required). With
// TLS 1.3 the client learns of the server's refusal at its first read, after it has
// written its first commands, which the server never ran.
func handshakeFailed(err error) bool {
	var verr *tls.CertificateVerificationError
	var rerr tls.RecordHeaderError
	var opErr *net.OpError
	switch {
	case errors.As(err, &verr):
		return true
	case errors.As(err, &rerr):
		return rerr.Conn != nil // set for the connection's first record only
	case errors.As(err, &opErr) && opErr.Op == "remote error" && opErr.Err != nil:
		// handshake failure; bad, unsupported, revoked, expired, unknown certificate;
		// unknown CA; access denied; protocol version; insufficient security; unknown
		// PSK identity; certificate required; no application protocol.
		for _, a := range [...]tls.AlertError{40, 42, 43, 44, 45, 46, 48, 49, 70, 71, 115, 116, 120} {
			// crypto/tls reports a received alert as an unexported type with the
			// text of the same AlertError.
			if opErr.Err.Error() == a.Error() {
				return true
			}
		}
	}
	return false
}

// replyError reports a reply of an unexpected shape.
type replyError struct{ msg string }

func (e *replyError) Error() string { return "lua: unexpected reply: " + e.msg }

func badReply(msg string) error {
	// The script ran and may have spent.
	return &ratebudget.StoreError{Class: ratebudget.ClassReply, Uncertain: true, Err: &replyError{msg}}
}
