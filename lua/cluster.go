package lua

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
)

// onceCmd is a script call that no go-redis client sends again once it may have
// reached the server. go-redis re-sends a command after a lost reply, a read timeout or
// a failed dial (Options.MaxRetries; in a ClusterClient also MaxRedirects, which -1
// cannot set apart from redirects), which would spend or refund twice; every client
// (Client, ClusterClient, AutoPipeliner) skips those retries for a command whose NoRetry
// reports true. A ClusterClient still follows MOVED and ASK redirects and READONLY
// replies for it: the server refused the command without running it.
type onceCmd struct{ *redis.Cmd }

// NoRetry reports true: the command must not be re-sent.
func (onceCmd) NoRetry() bool { return true }

// processor is what go-redis's clients offer to run a prepared command.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// checkCluster refuses ClusterClient options under which the limiter's commands could
// fail needlessly: MaxRedirects -1 returns a MOVED reply (the slot moved, nothing ran)
// as an error instead of following it. A client whose slot map comes from its
// ClusterSlots function (NewFailoverClusterClient: one Sentinel-watched primary, no
// MOVED) is not checked: NewFailoverClusterClient sets MaxRedirects from
// FailoverOptions.MaxRetries, which has no MaxRedirects of its own.
func checkCluster(c *redis.ClusterClient) error {
	if o := c.Options(); o.MaxRedirects == 0 && o.ClusterSlots == nil { // -1, after the client's own defaults
		return &ratebudget.ConfigError{Field: "MaxRedirects", Problem: "must not be -1: a MOVED or ASK reply (the slot moved, the script did not run) would be returned instead of followed; the limiter never lets the client re-send a script that may have run, whatever MaxRedirects and MaxRetries say"}
	}
	return nil
}

// reloadEvery is the shortest time between two slot map reloads a limiter asks for.
const reloadEvery = 100 * time.Millisecond

// reloader asks a ClusterClient to reload its slot map when an error says the
// topology may have changed: a master died (refused or reset connections), stalled
// (timeouts: it may be failed over), or the cluster says so (MOVED, ASK, READONLY,
// CLUSTERDOWN, TRYAGAIN, MASTERDOWN). go-redis reloads by itself on MOVED and READONLY
// only, and otherwise every ClusterStateReloadInterval (60 s by default): a failed-over
// master's slots would stay unreachable that long. Reloads run in the background, one
// at a time (the client's own LazyReload), and at most once per reloadEvery.
type reloader struct {
	c    *redis.ClusterClient
	last atomic.Int64 // time of the last request, in ns since the Unix epoch
}

func (r *reloader) noteErr(err error) {
	if r == nil || err == nil || !topologyError(err) {
		return
	}
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(reloadEvery) || !r.last.CompareAndSwap(last, now) {
		return
	}
	r.c.ReloadState(context.Background())
}

// topologyError reports whether err may mean that the slot map is out of date.
func topologyError(err error) bool {
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr), errors.As(err, &netErr) && netErr.Timeout(),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	for _, p := range []string{"MOVED", "ASK", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// tryAgain reports whether err is a TRYAGAIN error reply. Redis gives it before running
// a command (processCommand, clusterRedirectClient), to a call whose keys share a slot
// being migrated when some of them are on this node and others not. A running script
// gets no such reply: its cluster errors (an undeclared key of such a slot, a cluster
// gone down) are ERR replies, and the limiter's scripts reply no TRYAGAIN of their own.
// So a script call answered TRYAGAIN did not run.
func tryAgain(err error) bool {
	if err == nil {
		return false // before rErr, which escapes: every decision that succeeds comes here
	}
	var rErr redis.Error
	return errors.As(err, &rErr) && strings.HasPrefix(rErr.Error(), "TRYAGAIN ")
}
