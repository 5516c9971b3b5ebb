package wire

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestQueueCompacts: with replies owed all along (the queue never drains), the reader
// moves what is owed to the front instead of growing the queue with every command, and
// the calls still get their own replies in order; a lost connection then fails the rest.
func TestQueueCompacts(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	c := New(Options{Dial: func(context.Context) (net.Conn, error) { return client, nil }})
	l := &link{c: c, nc: client, wake: make(chan struct{}, 1), gone: make(chan struct{})}
	l.br = bufio.NewReaderSize(replyReader{l}, 32<<10)
	const total, answered = 3000, 2500
	calls := make([]*call, total)
	for i := range calls {
		calls[i] = &call{done: make(chan struct{}, 1), at: time.Now()}
	}
	l.queue = append(l.queue, calls...)
	go l.readLoop()
	go func() {
		for i := range answered {
			if _, err := fmt.Fprintf(server, "*1\r\n:%d\r\n", i); err != nil {
				return
			}
		}
	}()
	for i := range answered {
		<-calls[i].done
		if calls[i].err != nil || len(calls[i].ints) != 1 || calls[i].ints[0] != int64(i) {
			t.Fatalf("call %d: %v, %v", i, calls[i].ints, calls[i].err)
		}
	}
	l.mu.Lock()
	owed, head, next := len(l.queue)-l.head, l.head, l.queue[l.head]
	l.mu.Unlock()
	if owed != total-answered || next != calls[answered] {
		t.Fatalf("owed %d (want %d), next is call %p (want %p)", owed, total-answered, next, calls[answered])
	}
	if head >= 1024 {
		t.Fatalf("head at %d after %d replies: the queue was not compacted", head, answered)
	}
	server.Close()
	for i := answered; i < total; i++ {
		<-calls[i].done
		if calls[i].err == nil {
			t.Fatalf("call %d: no error after the connection was lost", i)
		}
	}
}
