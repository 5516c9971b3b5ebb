// Package autopipe sends concurrent script calls to Redis together, in pipelines: a
// caller that finds no batch in flight sends its own call at once (no added latency when
// idle), and calls that arrive meanwhile ride the next batch. Under load one network
// round trip and one pair of system calls on each side then serve many decisions,
// instead of one each.
//
// Only EVALSHA is batched. A batched call is still one independent command: NOSCRIPT,
// an error reply or a lost connection affect each call as they would unbatched, so
// go-redis's Script.Run falls back to EVAL as usual (EVAL is sent directly).
package autopipe

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is what the batcher needs: running scripts and pipelines. *redis.Client,
// *redis.ClusterClient and *redis.Ring implement it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Batcher implements redis.Scripter over c, batching EvalSha calls. It is safe for
// concurrent use and starts no goroutine while idle.
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
	sha  string
	keys []string
	args []any
	cmd  *redis.Cmd
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// New returns a batcher sending at most maxBatch calls per pipeline and at most
// maxInflight pipelines at once (both at least 1).
func New(c Client, maxBatch, maxInflight int) *Batcher {
	return &Batcher{c: c, maxBatch: max(maxBatch, 1), maxInflight: max(maxInflight, 1)}
}

var _ redis.Scripter = (*Batcher)(nil)

// EvalSha runs the script in the next batch. If ctx ends first it returns ctx's error;
// the call may still be sent and run (an uncertain result), unless its batch had not
// formed yet, in which case it is dropped unsent.
func (b *Batcher) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if err := ctx.Err(); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	cl := callPool.Get().(*call)
	cl.ctx, cl.sha, cl.keys, cl.args, cl.cmd = ctx, sha1, keys, args, nil
	b.mu.Lock()
	b.queue = append(b.queue, cl)
	lead := b.inflight < b.maxInflight
	if lead {
		b.inflight++
	}
	b.mu.Unlock()
	if lead {
		b.run()
	}
	select {
	case <-cl.done:
		cmd := cl.cmd
		cl.ctx, cl.keys, cl.args, cl.cmd = nil, nil, nil, nil
		callPool.Put(cl)
		return cmd
	case <-ctx.Done():
		// Abandoned: the batch still completes it (and signals done, buffered); the call
		// is not reused.
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}

// run sends one batch of the queued calls, then hands the rest, if any, to a new
// goroutine: the caller whose own call is answered returns without serving others.
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
			cl.cmd = redis.NewCmd(cl.ctx)
			cl.cmd.SetErr(err)
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
		cl.cmd = b.c.EvalSha(ctx, cl.sha, cl.keys, cl.args...)
		cl.done <- struct{}{}
		return
	}
	p := b.c.Pipeline()
	for _, cl := range live {
		cl.cmd = p.EvalSha(ctx, cl.sha, cl.keys, cl.args...)
	}
	_, _ = p.Exec(ctx) // each command carries its own result or error
	for _, cl := range live {
		cl.done <- struct{}{}
	}
}

// Eval is sent directly (it follows a NOSCRIPT and is rare).
func (b *Batcher) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.c.Eval(ctx, script, keys, args...)
}

// EvalRO is sent directly.
func (b *Batcher) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.c.EvalRO(ctx, script, keys, args...)
}

// EvalShaRO is sent directly.
func (b *Batcher) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return b.c.EvalShaRO(ctx, sha1, keys, args...)
}

// ScriptExists is sent directly.
func (b *Batcher) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return b.c.ScriptExists(ctx, hashes...)
}

// ScriptLoad is sent directly.
func (b *Batcher) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return b.c.ScriptLoad(ctx, script)
}
