// Package wire runs go-redis commands on one dedicated connection, pipelined: commands
// from concurrent callers are appended to one write buffer that a writer goroutine
// sends as it frees up, and a reader goroutine matches the replies to the callers in
// order. Compared with go-redis pipelines there is no per-batch connection checkout,
// hook chain or goroutine start, and a busy connection always has the next batch
// forming while the last one travels.
//
// A command is one independent command (a pipeline is not a transaction): an error
// reply affects that command only. A lost connection fails every command it owes a
// reply to, with an uncertain outcome; the next command dials again.
package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options configure a [Conn]. Dial is required.
type Options struct {
	// Dial opens a network connection (TLS included, if wanted).
	Dial func(ctx context.Context) (net.Conn, error)
	// Username and Password authenticate each new connection (AUTH), when Password is
	// not empty. Credentials, if set, is asked for them instead, at each dial.
	Username, Password string
	Credentials        func(ctx context.Context) (username, password string, err error)
	// DB is SELECTed on each new connection when not 0.
	DB int
	// ReplyTimeout is how long the connection may owe its oldest reply before it is
	// closed as dead (default 3s); WriteTimeout bounds one write (default 3s).
	ReplyTimeout, WriteTimeout time.Duration
	// IdleTimeout closes a connection that owed nothing for this long (default 5m).
	IdleTimeout time.Duration
}

// Conn sends commands over one connection at a time, dialed on first use and again
// after a failure. It is safe for concurrent use.
type Conn struct {
	opt Options

	mu      sync.Mutex
	cur     *link
	dialing chan struct{} // closed when the dial in progress ends
	closed  bool
}

// New returns a Conn; it dials on first use.
func New(opt Options) *Conn {
	if opt.ReplyTimeout <= 0 {
		opt.ReplyTimeout = 3 * time.Second
	}
	if opt.WriteTimeout <= 0 {
		opt.WriteTimeout = 3 * time.Second
	}
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = 5 * time.Minute
	}
	return &Conn{opt: opt}
}

// ErrClosed is returned by Process after Close, for a command that was not sent. It is
// go-redis's redis.ErrClosed.
var ErrClosed = redis.ErrClosed

// errClosedOwed fails the commands that a closed connection owed replies to: they may
// have run.
var errClosedOwed = fmt.Errorf("wire: connection closed with replies owed: %w", net.ErrClosed)

// ErrReplyShape is matched by the error of an [Conn.Ints] call whose reply was not an
// array of integers (the command ran).
var ErrReplyShape = errors.New("wire: unexpected reply")

// errIdle closes a connection that owed nothing for IdleTimeout.
var errIdle = errors.New("wire: idle connection closed")

// Close closes the connection; commands in flight fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	l := c.cur
	c.cur = nil
	c.mu.Unlock()
	if l != nil {
		l.fail(errClosedOwed)
	}
	return nil
}

// call is one command waiting for its reply: either a go-redis command (cmd), whose
// reply is stored in it, or arguments whose reply must be an array of integers (ints).
type call struct {
	cmd  redis.Cmder
	args []any     // with cmd == nil: the arguments, read only while queueing
	ints []int64   // with cmd == nil: the reply, owned by the call
	err  error     // with cmd == nil: the error
	at   time.Time // when it was queued
	done chan struct{}
	// timer bounds the wait when a timeout is given; it stays with the call (stopped
	// when idle) so that a timeout costs no allocation.
	timer *time.Timer
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// Process sends cmd and waits for its reply or for ctx to end. The reply is stored in
// cmd (a *redis.Cmd; other types get an error). A command whose context has
// ended is not sent. If ctx ends while the reply is owed, Process returns ctx's error
// and the command may still run.
func (c *Conn) Process(ctx context.Context, cmd redis.Cmder) error {
	cl := callPool.Get().(*call)
	cl.cmd = cmd
	if abandoned, err := c.send(ctx, 0, cl); err != nil {
		if !abandoned {
			cmd.SetErr(err) // an abandoned cmd is the reader's to complete
		}
		return err
	}
	cl.release()
	return cmd.Err()
}

// Ints sends args (strings, []byte, int, int64, and pointers to string, []byte and int64) and
// appends the reply, which must be an array of integers, to dst. An error reply is an
// [Error]; a reply of another shape matches [ErrReplyShape]. Context handling is as for
// Process; a timeout above zero also bounds the wait (context.DeadlineExceeded), without
// the cost of a context with a deadline. args are not used after Ints returns.
func (c *Conn) Ints(ctx context.Context, timeout time.Duration, args []any, dst []int64) ([]int64, error) {
	cl := callPool.Get().(*call)
	cl.args = args
	if _, err := c.send(ctx, timeout, cl); err != nil {
		return dst, err
	}
	dst, err := append(dst, cl.ints...), cl.err
	cl.release()
	return dst, err
}

// send queues cl and waits for its reply, for ctx to end or for timeout (if above
// zero) to pass. When it returns nil the reply is in cl, which the caller releases.
// abandoned reports an error after cl was queued: cl then belongs to the reader, which
// completes it when the reply comes, and must not be touched or reused.
func (c *Conn) send(ctx context.Context, timeout time.Duration, cl *call) (abandoned bool, err error) {
	if err := ctx.Err(); err != nil {
		cl.release()
		return false, err
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for attempt := 0; ; attempt++ {
		l, err := c.link(ctx, deadline)
		if err != nil {
			cl.release()
			return false, err
		}
		queued, err := l.enqueue(cl)
		cl.args = nil // encoded, or not to be sent
		if queued {
			break
		}
		// The link died before the command was queued: nothing was sent.
		c.drop(l)
		if attempt == 1 {
			cl.release()
			return false, err
		}
	}
	if timeout <= 0 {
		select {
		case <-cl.done:
			return false, nil // the reply is in cl; the caller releases it after reading
		case <-ctx.Done():
			// Abandoned: the reader still completes it (done is buffered); not reused.
			return true, ctx.Err()
		}
	}
	left := time.Until(deadline)
	if cl.timer == nil {
		cl.timer = time.NewTimer(left)
	} else {
		cl.timer.Reset(left)
	}
	select {
	case <-cl.done:
		cl.timer.Stop()
		return false, nil
	case <-ctx.Done():
		cl.timer.Stop()
		return true, ctx.Err() // abandoned, as above
	case <-cl.timer.C:
		return true, context.DeadlineExceeded // abandoned, as above
	}
}

// release returns cl to the pool; only its owner, after its reply, may call it.
func (cl *call) release() {
	cl.cmd, cl.args, cl.err = nil, nil, nil
	cl.ints = cl.ints[:0]
	callPool.Put(cl)
}

// setErr records err as cl's outcome.
func (cl *call) setErr(err error) {
	if cl.cmd != nil {
		cl.cmd.SetErr(err)
	} else {
		cl.err = err
	}
}

// link returns the live connection, dialing one if there is none. A deadline that is
// not zero bounds the dial and the wait for another caller's dial.
func (c *Conn) link(ctx context.Context, deadline time.Time) (*link, error) {
	c.mu.Lock()
	if l := c.cur; l != nil && !c.closed {
		c.mu.Unlock()
		return l, nil // the common case: no context to derive
	}
	c.mu.Unlock()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if l := c.cur; l != nil {
			c.mu.Unlock()
			return l, nil
		}
		if ch := c.dialing; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		c.dialing = ch
		c.mu.Unlock()

		l, err := c.dial(ctx)
		c.mu.Lock()
		c.dialing = nil
		close(ch)
		if err == nil {
			if c.closed {
				c.mu.Unlock()
				l.fail(errClosedOwed)
				return nil, ErrClosed
			}
			c.cur = l
		}
		c.mu.Unlock()
		return l, err
	}
}

// drop forgets l if it is the current link.
func (c *Conn) drop(l *link) {
	c.mu.Lock()
	if c.cur == l {
		c.cur = nil
	}
	c.mu.Unlock()
}

func (c *Conn) dial(ctx context.Context) (*link, error) {
	nc, err := c.opt.Dial(ctx)
	if err != nil {
		return nil, err
	}
	l := &link{c: c, nc: nc, wake: make(chan struct{}, 1), gone: make(chan struct{})}
	l.br = bufio.NewReaderSize(replyReader{l}, 32<<10)
	if err := l.handshake(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	go l.writeLoop()
	go l.readLoop()
	return l, nil
}

// link is one connection with its writer and reader goroutines.
type link struct {
	c  *Conn
	nc net.Conn
	br *bufio.Reader

	mu      sync.Mutex
	wbuf    []byte  // commands to write
	spare   []byte  // the writer's other buffer
	queue   []*call // owed replies, oldest first, from head
	head    int
	err     error     // set once the link is dead
	idle    time.Time // since when nothing is owed
	reading bool      // the reader is parsing the reply of queue[head] and completes it
	once    sync.Once // closes the connection

	wake chan struct{} // the writer has something to write
	gone chan struct{} // closed when the link dies
}

// handshake authenticates and selects the database, synchronously, before the link
// carries any command.
func (l *link) handshake(ctx context.Context) error {
	var cmds [][]any
	user, pass := l.c.opt.Username, l.c.opt.Password
	if l.c.opt.Credentials != nil {
		var err error
		if user, pass, err = l.c.opt.Credentials(ctx); err != nil {
			return err
		}
	}
	if pass != "" {
		if user != "" {
			cmds = append(cmds, []any{"auth", user, pass})
		} else {
			cmds = append(cmds, []any{"auth", pass})
		}
	}
	if l.c.opt.DB != 0 {
		cmds = append(cmds, []any{"select", l.c.opt.DB})
	}
	if len(cmds) == 0 {
		return nil
	}
	// Bounded by the context's deadline, and by the reply timeout in any case: a server
	// that accepts connections but never answers must not hold the dial forever.
	d := time.Now().Add(l.c.opt.ReplyTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	l.nc.SetDeadline(d)
	defer l.nc.SetDeadline(time.Time{})
	var buf []byte
	for _, args := range cmds {
		var err error
		if buf, err = appendCommand(buf, args); err != nil {
			return err
		}
	}
	if _, err := l.nc.Write(buf); err != nil {
		return err
	}
	br := bufio.NewReader(l.nc) // bounded by the deadline above, unlike l.br
	for range cmds {
		v, err := readReply(br)
		if err != nil {
			return err
		}
		if e, ok := v.(Error); ok {
			return e
		}
	}
	return nil
}

// enqueue appends cl's command to the write buffer. It reports false, with the link's
// error, if the link is dead (nothing was queued).
func (l *link) enqueue(cl *call) (bool, error) {
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return false, err
	}
	n := len(l.wbuf)
	args := cl.args
	if cl.cmd != nil {
		args = cl.cmd.Args()
	}
	var err error
	l.wbuf, err = appendCommand(l.wbuf, args)
	if err != nil {
		l.wbuf = l.wbuf[:n]
		l.mu.Unlock()
		cl.setErr(err)
		cl.done <- struct{}{}
		return true, nil
	}
	cl.at = time.Now()
	if l.head == len(l.queue) {
		// Nothing was owed: the reader may be waiting with the idle deadline. Bring it
		// forward to this command's reply timeout (replyReader checks it on wake-up).
		l.nc.SetReadDeadline(cl.at.Add(l.c.opt.ReplyTimeout))
	}
	l.queue = append(l.queue, cl)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true, nil
}

func (l *link) writeLoop() {
	for {
		select {
		case <-l.wake:
		case <-l.gone:
			return
		}
		// Let callers that are ready to run queue their commands first: a batch costs
		// two system calls on each side whatever its size.
		runtime.Gosched()
		l.mu.Lock()
		if len(l.wbuf) == 0 {
			l.mu.Unlock()
			continue
		}
		// Swap buffers: callers append to the other one while this one is written.
		buf := l.wbuf
		l.wbuf, l.spare = l.spare[:0], nil
		l.mu.Unlock()
		l.nc.SetWriteDeadline(time.Now().Add(l.c.opt.WriteTimeout))
		_, err := l.nc.Write(buf)
		if err != nil {
			l.fail(err)
			return
		}
		l.mu.Lock()
		l.spare = buf[:0]
		l.mu.Unlock()
	}
}

func (l *link) readLoop() {
	for {
		line, err := readLine(l.br)
		if err != nil {
			l.fail(err)
			return
		}
		// The reply belongs to the oldest owed call, which only this loop removes.
		l.mu.Lock()
		if l.head == len(l.queue) {
			l.mu.Unlock()
			l.fail(errors.New("wire: reply without a command"))
			return
		}
		cl := l.queue[l.head]
		l.reading = true // fail leaves cl to this loop
		l.mu.Unlock()
		var v any
		if cl.cmd != nil {
			v, err = parseReply(line, l.br)
		} else {
			err = parseInts(line, l.br, cl)
		}
		l.mu.Lock()
		l.reading = false
		l.queue[l.head] = nil
		l.head++
		if l.head == len(l.queue) {
			l.queue, l.head = l.queue[:0], 0
			l.idle = time.Now()
		} else if l.head >= 1024 && l.head >= len(l.queue)/2 {
			// Under sustained load the queue may never drain: move what is owed to the
			// front so that the slice does not grow with every command ever sent.
			n := copy(l.queue, l.queue[l.head:])
			clear(l.queue[n:])
			l.queue, l.head = l.queue[:n], 0
		}
		l.mu.Unlock()
		switch {
		case err != nil:
			cl.setErr(err) // the stream broke inside the reply
		case cl.cmd != nil:
			deliver(cl.cmd, v)
		}
		cl.done <- struct{}{}
		if err != nil {
			l.fail(err)
			return
		}
	}
}

// fail kills the link: every owed command fails with the link's first error
// (uncertain: it may have run), the connection is closed and the Conn forgets the link.
func (l *link) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	err = l.err
	from := l.head
	if l.reading {
		from++ // the reader completes the call whose reply it is parsing
	}
	owed := append([]*call(nil), l.queue[from:]...)
	clear(l.queue[from:])
	l.queue = l.queue[:from]
	l.mu.Unlock()
	l.once.Do(func() {
		close(l.gone)
		l.nc.Close()
		l.c.drop(l)
	})
	for _, cl := range owed {
		cl.setErr(err)
		cl.done <- struct{}{}
	}
}

// replyReader reads from the connection with deadlines: a read that times out while
// the oldest owed reply is younger than ReplyTimeout (or while nothing is owed and the
// link has not been idle for IdleTimeout) is retried.
type replyReader struct{ l *link }

func (r replyReader) Read(p []byte) (int, error) {
	l := r.l
	for {
		now := time.Now()
		l.mu.Lock()
		var deadline time.Time
		if l.head < len(l.queue) {
			deadline = l.queue[l.head].at.Add(l.c.opt.ReplyTimeout)
			if !deadline.After(now) {
				l.mu.Unlock()
				return 0, errTimeout
			}
		} else {
			if l.idle.IsZero() {
				l.idle = now
			}
			deadline = l.idle.Add(l.c.opt.IdleTimeout)
			if !deadline.After(now) {
				// Dead from now on, under the lock: a command queued after this check
				// finds the link dead and dials a new one.
				l.err = errIdle
				l.mu.Unlock()
				return 0, errIdle
			}
		}
		// Set under the lock, so that enqueue's earlier deadline is not overwritten.
		l.nc.SetReadDeadline(deadline)
		l.mu.Unlock()
		n, err := l.nc.Read(p)
		if n > 0 || err == nil {
			return n, err
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return n, err
		}
		// Timed out: loop to see whether a new command moved the deadline.
	}
}

var errTimeout = &timeoutError{}

type timeoutError struct{}

func (*timeoutError) Error() string   { return "wire: no reply within the reply timeout" }
func (*timeoutError) Timeout() bool   { return true }
func (*timeoutError) Temporary() bool { return true }

var _ net.Error = errTimeout

// Error is an error reply from the server. It satisfies go-redis's redis.Error.
type Error string

// Error returns the server's message, e.g. "NOSCRIPT No matching script."
func (e Error) Error() string { return string(e) }

// RedisError marks Error as a server reply (see redis.Error).
func (Error) RedisError() {}

var _ redis.Error = Error("")

// deliver stores reply v (or an Error) in cmd.
func deliver(cmd redis.Cmder, v any) {
	if e, ok := v.(Error); ok {
		cmd.SetErr(e)
		return
	}
	switch c := cmd.(type) {
	case *redis.Cmd:
		if v == nil {
			c.SetErr(redis.Nil)
			return
		}
		c.SetVal(v)
	default:
		cmd.SetErr(fmt.Errorf("wire: unsupported command type %T", cmd))
	}
}

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(b []byte, args []any) ([]byte, error) {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		switch v := a.(type) {
		case string:
			b = appendBulk(b, v)
		case *string:
			b = appendBulk(b, *v)
		case []byte:
			b = appendBulk(b, v)
		case *[]byte:
			b = appendBulk(b, *v)
		case int:
			b = appendInt(b, int64(v))
		case int64:
			b = appendInt(b, v)
		case *int64:
			b = appendInt(b, *v)
		default:
			return b, fmt.Errorf("wire: unsupported argument type %T", a)
		}
	}
	return b, nil
}

func appendBulk[T string | []byte](b []byte, s T) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

func appendInt(b []byte, n int64) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], n, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(d)), 10)
	b = append(b, '\r', '\n')
	b = append(b, d...)
	return append(b, '\r', '\n')
}

// maxBulk bounds a bulk string or array in a reply (a corrupt stream must not make the
// reader allocate without limit).
const maxBulk = 512 << 20

// readReply reads one RESP2 reply: int64, string (simple or bulk), nil, []any, or Error.
func readReply(br *bufio.Reader) (any, error) {
	line, err := readLine(br)
	if err != nil {
		return nil, err
	}
	return parseReply(line, br)
}

// parseInts reads the reply that starts with line, which should be an array of
// integers, into cl.ints. A reply of another shape is read whole (the stream stays in
// step) and becomes cl.err: an [Error] for an error reply, else a description. The
// error returned is a broken stream.
func parseInts(line []byte, br *bufio.Reader, cl *call) error {
	cl.ints, cl.err = cl.ints[:0], nil
	if len(line) > 0 && line[0] == '*' {
		n, err := parseInt(line[1:])
		if err != nil || n > maxBulk {
			return errProtocol
		}
		if n < 0 {
			cl.err = redis.Nil
			return nil
		}
		for i := int64(0); i < n; i++ {
			el, err := readLine(br)
			if err != nil {
				return err
			}
			if len(el) > 0 && el[0] == ':' {
				v, err := parseInt(el[1:])
				if err != nil {
					return err
				}
				cl.ints = append(cl.ints, v)
				continue
			}
			// Not an integer: read the rest and report the shape.
			v, err := parseReply(el, br)
			if err != nil {
				return err
			}
			for i++; i < n; i++ {
				if _, err := readReply(br); err != nil {
					return err
				}
			}
			cl.err = fmt.Errorf("%w: element %d is %T, want an integer", ErrReplyShape, len(cl.ints), v)
			return nil
		}
		return nil
	}
	v, err := parseReply(line, br)
	if err != nil {
		return err
	}
	switch v := v.(type) {
	case Error:
		cl.err = v
	case nil:
		cl.err = redis.Nil
	default:
		cl.err = fmt.Errorf("%w: reply is %T, want an array of integers", ErrReplyShape, v)
	}
	return nil
}

// parseReply reads the rest of the reply that starts with line (see readReply).
func parseReply(line []byte, br *bufio.Reader) (any, error) {
	if len(line) == 0 {
		return nil, errProtocol
	}
	switch line[0] {
	case ':':
		return parseInt(line[1:])
	case '+':
		return string(line[1:]), nil
	case '-':
		return Error(line[1:]), nil
	case '$':
		n, err := parseInt(line[1:])
		if err != nil || n > maxBulk {
			return nil, errProtocol
		}
		if n < 0 {
			return nil, nil
		}
		// Grown as the bytes arrive: a corrupt length must not allocate up front.
		buf := make([]byte, 0, min(n+2, 64<<10))
		for int64(len(buf)) < n+2 {
			chunk := min(n+2-int64(len(buf)), 64<<10)
			start := len(buf)
			buf = append(buf, make([]byte, chunk)...)
			if _, err := readFull(br, buf[start:]); err != nil {
				return nil, err
			}
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, errProtocol
		}
		return string(buf[:n]), nil
	case '*':
		n, err := parseInt(line[1:])
		if err != nil || n > maxBulk {
			return nil, errProtocol
		}
		if n < 0 {
			return nil, nil
		}
		vals := make([]any, 0, min(n, 1024)) // grown as elements arrive, as above
		for range n {
			v, err := readReply(br)
			if err != nil {
				return nil, err
			}
			vals = append(vals, v) // an Error inside an array stays a value, as in go-redis
		}
		return vals, nil
	}
	return nil, errProtocol
}

var errProtocol = errors.New("wire: protocol error")

// readLine returns the next line without its CRLF; the slice is valid until the next
// read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errProtocol
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errProtocol
	}
	return line[:len(line)-2], nil
}

func readFull(br *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := br.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func parseInt(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, errProtocol
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, errProtocol
		}
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' || n > (1<<62)/10 {
			return 0, errProtocol
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}
