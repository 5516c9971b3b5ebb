package lua

import (
	"context"
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
	se := &ratebudget.StoreError{Class: "other", Uncertain: true, Err: err}
	var opErr *net.OpError
	var netErr net.Error
	var rErr redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		se.Class = "reply" // the script ran but its reply is unusable
	case errors.As(err, &opErr) && opErr.Op == "dial":
		// No connection, so nothing was sent, even when the dial ran out of time (a
		// blackholed address): checked before the context errors a dial timeout matches.
		se.Class, se.Uncertain = "connection", false
	case errors.Is(err, context.Canceled):
		se.Class = "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		se.Class = "timeout"
	case errors.Is(err, redis.ErrPoolTimeout):
		// No connection was free: the script was never sent.
		se.Class, se.Uncertain = "timeout", false
	case errors.Is(err, redis.ErrClosed):
		se.Class, se.Uncertain = "connection", false
	case errors.As(err, &rErr):
		// The server answered with an error: the script did not spend (it validates
		// before its first write, and an OOM refusal comes at the first write).
		se.Class, se.Uncertain = "server", false
	case errors.As(err, &netErr) && netErr.Timeout():
		se.Class = "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed), errors.As(err, &opErr):
		se.Class = "connection"
	}
	return se
}

// replyError reports a reply of an unexpected shape.
type replyError struct{ msg string }

func (e *replyError) Error() string { return "lua: unexpected reply: " + e.msg }

func badReply(msg string) error {
	// The script ran and may have spent.
	return &ratebudget.StoreError{Class: "reply", Uncertain: true, Err: &replyError{msg}}
}
