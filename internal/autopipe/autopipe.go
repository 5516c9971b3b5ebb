// Package autopipe sends concurrent commands to Redis together, in pipelines: a command
// that finds no batch in flight is sent at once (no waiting when idle), and commands that
// arrive meanwhile ride the next batch. Under load one network
// round trip and one pair of system calls on each side then serve many decisions,
// instead of one each.
//
// A batched command is still one independent command (a pipeline is not a
// transaction): NOSCRIPT, an error reply or a lost connection affect each command as they
// would unbatched.
package autopipe

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is what the batcher needs: running commands and pipelines. *redis.Client,
// *redis.ClusterClient and *redis.Ring implement it.
type Client interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// Batcher runs commands through c, batching concurrent ones into pipelines. It is safe
// for concurrent use and starts no goroutine while idle.
type Batcher struct {
	c           Client
	maxBatch    int
	maxInflight int

	mu       sync.Mutex
	queue    []*call
	inflight int
}

type call struct {
	ctx  context.Context
	cmd  redis.Cmder
	err  error
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// New returns a batcher sending at most maxBatch calls per pipeline and at most
// maxInflight pipelines at once (both at least 1).
func New(c Client, maxBatch, maxInflight int) *Batcher {
	return &Batcher{c: c, maxBatch: max(maxBatch, 1), maxInflight: max(maxInflight, 1)}
}

// Process runs cmd in the next batch and returns its error. If ctx ends first it
// returns ctx's error; the command may still be sent and run (an uncertain result), so
// the caller must not reuse cmd's arguments. A command whose context ended before its
// batch formed is dropped unsent.
func (b *Batcher) Process(ctx context.Context, cmd redis.Cmder) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cl := callPool.Get().(*call)
	cl.ctx, cl.cmd, cl.err = ctx, cmd, nil
	b.mu.Lock()
	b.queue = append(b.queue, cl)
	lead := b.inflight < b.maxInflight
	if lead {
		b.inflight++
	}
	b.mu.Unlock()
	if lead {
		// The batch is sent from its own goroutine so that every caller, this one too,
		// waits on its own context: a client that ignores contexts (go-redis without
		// ContextTimeoutEnabled) cannot hold a caller past its deadline.
		go b.run()
	}
	select {
	case <-cl.done:
		err := cl.err
		cl.ctx, cl.cmd = nil, nil
		callPool.Put(cl)
		return err
	case <-ctx.Done():
		// Abandoned: the batch still completes it (and signals done, buffered); the call
		// is not reused.
		return ctx.Err()
	}
}

// run sends one batch of the queued calls, then hands the rest, if any, to a new
// goroutine.
func (b *Batcher) run() {
	b.mu.Lock()
	n := min(len(b.queue), b.maxBatch)
	batch := make([]*call, n)
	copy(batch, b.queue)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	b.mu.Unlock()

	b.send(batch)

	b.mu.Lock()
	more := len(b.queue) > 0
	if !more {
		b.inflight--
	}
	b.mu.Unlock()
	if more {
		go b.run()
	}
}

func (b *Batcher) send(batch []*call) {
	// The pipeline lives as long as its most patient caller: the latest deadline, or
	// none if a caller has none. Calls whose context already ended are dropped unsent.
	var deadline time.Time
	forever := false
	live := batch[:0:len(batch)]
	for _, cl := range batch {
		if err := cl.ctx.Err(); err != nil {
			cl.err = err
			cl.done <- struct{}{}
			continue
		}
		if d, ok := cl.ctx.Deadline(); !ok {
			forever = true
		} else if d.After(deadline) {
			deadline = d
		}
		live = append(live, cl)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !forever {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if len(live) == 1 {
		cl := live[0]
		cl.err = b.c.Process(ctx, cl.cmd)
		cl.done <- struct{}{}
		return
	}
	p := b.c.Pipeline()
	for _, cl := range live {
		_ = p.Process(ctx, cl.cmd) // queued; the result comes with Exec
	}
	_, _ = p.Exec(ctx) // each command carries its own result or error
	for _, cl := range live {
		cl.err = cl.cmd.Err()
		cl.done <- struct{}{}
	}
}
