package middleware

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/meta"
)

// Counting is a rule's counting contract: what an admitted request is charged, and when
// that is known. Every contract but attempts reserves a cost when the request is
// admitted and settles it once the handler has returned (also when it panics, and when
// the client has gone away), through the limiter's Reserve and Settle ("Settling a
// decision" in package ratebudget):
//
//	contract                  reserved at admission         settled when the handler returns
//	attempts (zero value)     the layer's cost (WithCost)   never: every admitted attempt counts
//	CountSuccesses            the layer's cost              given back when the response is not charged
//	                                                        (default: status 500 or above)
//	CountActual               an estimate                   the actual cost from a callback or a response header
//	CountRequestBytes         Content-Length (1 if unknown) Content-Length, or the body bytes read when unknown
//	CountResponseBytes        an estimate                   the body bytes the handler wrote (none for HEAD)
//
// A settled cost above the reserved one spends the difference without refusing it: the
// budget goes into debt and the next requests wait. A handler
// that panics is treated as a response with status 500, unless it panics with
// http.ErrAbortHandler after it wrote its status: that response was cut short, not
// failed, and keeps its status (httputil.ReverseProxy aborts so when the client goes
// away mid-body, and a client must not escape the charge of a response by leaving
// before its last byte). A contract's callback that
// panics settles the request at its reservation (its leases released) and the panic
// goes on. The status is the one the handler wrote, as seen where the middleware is
// mounted, with two exceptions for timeout middlewares mounted outside it: a handler
// that returns without writing a status after its request's deadline passed is treated
// as a response with status 504 (chi's middleware.Timeout answers so), and one whose
// write failed with http.ErrHandlerTimeout as a 503 (http.TimeoutHandler has answered
// so). A handler that hijacks the connection (a WebSocket upgrade) is charged its
// reservation: what it then reads and writes on the raw connection is not seen (a
// request without a body is still charged nothing under CountRequestBytes). An InFlight
// rule holds one lease per request, released when the handler returns; it has no other
// contract, so its Counts must be the zero value.
type Counting struct {
	kind     countKind
	charged  func(status int) bool
	estimate int64
	actual   func(r *http.Request, status int, header http.Header) int64
	// header is CountResponseHeader's header name, validated by New (byHeader is set).
	header   string
	byHeader bool
}

type countKind uint8

const (
	countAttempts countKind = iota
	countSuccesses
	countActual
	countRequestBytes
	countResponseBytes
)

// String names the contract, as the option that sets it.
func (k countKind) String() string {
	switch k {
	case countSuccesses:
		return "CountSuccesses"
	case countActual:
		return "CountActual"
	case countRequestBytes:
		return "CountRequestBytes"
	case countResponseBytes:
		return "CountResponseBytes"
	}
	return "attempts"
}

// CountSuccesses charges a request only when charged(status) reports true for the
// response's status; nil charged means status < 500, so that server failures are not
// charged. The cost is reserved at admission, so concurrent requests cannot overspend
// while the handler runs, and given back afterwards when the response is not charged.
func CountSuccesses(charged func(status int) bool) Counting {
	if charged == nil {
		charged = func(status int) bool { return status < 500 }
	}
	return Counting{kind: countSuccesses, charged: charged}
}

// CountActual reserves estimate units at admission and settles at the cost actual
// reports once the handler has returned, given the request, the response's status and
// its header (as the handler left it). A negative result keeps the estimate. estimate
// must be in 1..the rule's capacity.
func CountActual(estimate int64, actual func(r *http.Request, status int, header http.Header) int64) Counting {
	return Counting{kind: countActual, estimate: estimate, actual: actual}
}

// CountResponseHeader reserves estimate units at admission and settles at the decimal
// integer the handler sets in the response header name (a token count, query cost
// units): as a header, as a declared trailer, or as an undeclared trailer (a header
// map key of http.TrailerPrefix and name, in any case), which is read first, since it
// is set once the header went out. A header that is missing or not a non-negative
// integer keeps the estimate. estimate must be in 1..the rule's capacity, and name a
// valid header field name (New refuses others).
func CountResponseHeader(estimate int64, name string) Counting {
	key := http.CanonicalHeaderKey(name)
	return Counting{kind: countActual, estimate: estimate, header: name, byHeader: true, actual: func(_ *http.Request, _ int, h http.Header) int64 {
		vv, ok := trailerValues(h, key)
		if !ok {
			vv = h[key]
		}
		if len(vv) == 0 {
			return -1
		}
		v, err := strconv.ParseInt(vv[0], 10, 64)
		if err != nil || v < 0 {
			return -1
		}
		return v
	}}
}

// trailerValues returns the values of the undeclared trailer key (canonical) in h: the
// entry of http.TrailerPrefix and key, or of the prefix and key in another case, which
// net/http sends as key (header map keys with a colon are not canonicalized).
func trailerValues(h http.Header, key string) ([]string, bool) {
	if vv, ok := h[http.TrailerPrefix+key]; ok {
		return vv, true
	}
	for k, vv := range h {
		if rest, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && strings.EqualFold(rest, key) {
			return vv, true
		}
	}
	return nil, false
}

// validFieldName reports whether s is an HTTP field name: a non-empty token of RFC 9110
// §5.1 (no space, no colon, no control byte).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// CountRequestBytes charges the request body's bytes: its Content-Length when it
// declares one (a body that declares more than the rule's capacity is refused with 413
// before anything is spent), or, for a body without a length, 1 at admission settled at
// the bytes the handler read. A request without a body is charged nothing, and so is
// one over HTTP/1.1 whose client waits for 100 Continue (Expect: 100-continue) when the
// handler never reads the body, which is then never sent (net/http's HTTP/2 server hides
// that header: there a declared length is charged). A declared body the handler reads
// only in part is charged in full. The unit in the metadata is content-bytes.
func CountRequestBytes() Counting { return Counting{kind: countRequestBytes} }

// CountResponseBytes reserves estimate bytes at admission (at least 1, at most the rule's
// capacity) and settles at the body bytes the handler wrote that net/http took: a HEAD
// response, whose body net/http discards, and a 204 or 304, which has none, are charged
// nothing; after a write error, only what was written before it. The bytes are those
// that pass through this middleware: with a compression middleware around it, the bytes
// before compression; with one inside it, the compressed bytes. The unit in the metadata
// is content-bytes.
func CountResponseBytes(estimate int64) Counting {
	return Counting{kind: countResponseBytes, estimate: estimate}
}

// layerCost reports whether the contract reserves the layer's cost.
func (c *Counting) layerCost() bool { return c.kind == countAttempts || c.kind == countSuccesses }

func (cr *compiledRule) settles() bool {
	return cr.counts.kind != countAttempts || cr.rule.Algorithm == ratebudget.InFlight
}

// compileCounts validates the rule's contract.
func (cr *compiledRule) compileCounts() error {
	bad := func(problem string) error {
		return &ratebudget.ConfigError{Rule: cr.rule.Name, Field: "Counts", Problem: problem}
	}
	c := &cr.counts
	if cr.rule.Algorithm == ratebudget.InFlight {
		if c.kind != countAttempts {
			return bad("must be the zero value for an InFlight rule (a request holds one lease)")
		}
		cr.unit = meta.UnitConcurrentRequests
		return nil
	}
	switch c.kind {
	case countSuccesses:
		if c.charged == nil {
			return bad("CountSuccesses must be made by its constructor")
		}
	case countActual:
		if c.actual == nil {
			return bad("CountActual needs a function")
		}
		if c.byHeader && !validFieldName(c.header) {
			return bad("CountResponseHeader header name " + strconv.Quote(c.header) + " is not a valid header field name")
		}
		fallthrough
	case countResponseBytes:
		if c.estimate < 1 || c.estimate > cr.limit {
			return bad("estimate must be in 1.." + strconv.FormatInt(cr.limit, 10) + ", got " + strconv.FormatInt(c.estimate, 10))
		}
	}
	if c.kind == countRequestBytes || c.kind == countResponseBytes {
		cr.unit = meta.UnitContentBytes
	}
	return nil
}

// reserve is the cost the rule reserves for r, given the layer's cost.
func (cr *compiledRule) reserve(r *http.Request, cost int64) int64 {
	if cr.rule.Algorithm == ratebudget.InFlight {
		return 1
	}
	switch cr.counts.kind {
	case countActual, countResponseBytes:
		return cr.counts.estimate
	case countRequestBytes:
		return max(r.ContentLength, 1)
	}
	return cost
}

// actual is the cost check c of the rule is settled at, for the response seen by rec.
func (cr *compiledRule) actual(r *http.Request, c *ratebudget.Check, rec *recorder) int64 {
	if cr.rule.Algorithm == ratebudget.InFlight {
		return c.Cost // the lease is released whatever the cost
	}
	a := c.Cost
	noBody := r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody
	if rec.hijacked && !(cr.counts.kind == countRequestBytes && noBody) {
		// What the handler does on the raw connection is not seen: the reservation stands
		// (a request without a body has none to charge, hijacked or not).
		return c.Cost
	}
	switch cr.counts.kind {
	case countSuccesses:
		if !cr.counts.charged(rec.status()) {
			a = 0
		}
	case countActual:
		if v := cr.counts.actual(r, rec.status(), rec.Header()); v >= 0 {
			a = v
		}
	case countRequestBytes:
		switch {
		case noBody:
			a = 0
		case r.ContentLength < 0:
			a = rec.read
		case rec.awaitsBody && !rec.askedBody:
			a = 0 // Expect: 100-continue, and the body was never asked for: never sent
		}
	case countResponseBytes:
		a = rec.written
		if r.Method == http.MethodHead {
			a = 0 // net/http discards a HEAD response's body: nothing was sent
		}
	}
	return min(max(a, 0), bound.MaxLimit)
}

// recorder sees what the handler did with the request and the response: the status, the
// bytes written and the request body's bytes read. It passes every write on, and
// http.ResponseController reaches the writer it wraps through Unwrap. The handler gets
// it as [recorder.writer] makes it, with the optional interfaces of the writer it wraps.
type recorder struct {
	http.ResponseWriter
	code     int
	written  int64
	read     int64
	panicked bool
	aborted  bool // the panic was http.ErrAbortHandler
	hijacked bool // the handler took the connection over
	// timedOut: a write failed with http.ErrHandlerTimeout (http.TimeoutHandler has
	// answered 503); late: the handler returned without a status after its request's
	// deadline passed (chi's middleware.Timeout then answers 504).
	timedOut, late bool
	// awaitsBody: the client sends the body only once asked (Expect: 100-continue);
	// askedBody: the handler read from it, which asks.
	awaitsBody, askedBody bool
}

func (rec *recorder) status() int {
	switch {
	case rec.panicked && !(rec.aborted && rec.code != 0):
		return http.StatusInternalServerError
	case rec.timedOut:
		return http.StatusServiceUnavailable
	case rec.code == 0 && rec.late:
		return http.StatusGatewayTimeout
	case rec.code == 0:
		return http.StatusOK // nothing written: net/http answers 200
	}
	return rec.code
}

// WriteHeader records the status and passes it on.
func (rec *recorder) WriteHeader(code int) {
	if rec.code == 0 && code >= 200 {
		rec.code = code
	}
	rec.ResponseWriter.WriteHeader(code)
}

// Write counts the bytes written.
func (rec *recorder) Write(b []byte) (int, error) {
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	n, err := rec.ResponseWriter.Write(b)
	rec.written += int64(n)
	if errors.Is(err, http.ErrHandlerTimeout) {
		rec.timedOut = true
	}
	return n, err
}

// ReadFrom copies src to the response through the wrapped writer's ReadFrom when it has
// one (net/http's sends a file with sendfile), else through its Write, and counts the
// bytes written.
func (rec *recorder) ReadFrom(src io.Reader) (int64, error) {
	var n int64
	var err error
	if rf, ok := rec.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(src)
	} else {
		n, err = io.Copy(writerOnly{rec.ResponseWriter}, src)
	}
	if rec.code == 0 && n > 0 {
		rec.code = http.StatusOK
	}
	rec.written += n
	if errors.Is(err, http.ErrHandlerTimeout) {
		rec.timedOut = true
	}
	return n, err
}

// writerOnly hides every method of a writer but Write, so that io.Copy does not call
// ReadFrom again.
type writerOnly struct{ io.Writer }

// Unwrap returns the wrapped writer, for http.ResponseController.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// expectsContinue reports whether r's client waits for 100 Continue before it sends the
// body (RFC 9110 §10.1.1), which net/http sends on the handler's first read of it.
func expectsContinue(r *http.Request) bool {
	if !r.ProtoAtLeast(1, 1) {
		return false
	}
	for _, v := range r.Header.Values("Expect") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "100-continue") {
				return true
			}
		}
	}
	return false
}

// countingBody counts the request body's bytes read into rec.
type countingBody struct {
	io.ReadCloser
	rec *recorder
}

func (b *countingBody) Read(p []byte) (int, error) {
	b.rec.askedBody = true
	n, err := b.ReadCloser.Read(p)
	b.rec.read += int64(n)
	return n, err
}
