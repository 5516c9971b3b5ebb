package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A -redis value that cannot be used is refused before the server starts, with an
// error that names the flag and shows no part of the URL's user name or password:
// parse errors quote the URL, and a password with an unescaped / ? or # is read as
// part of the host, the port or the path.
func TestRedisURLErrorsHideCredentials(t *testing.T) {
	for _, u := range []string{
		"redis://:s3cret@127.0.0.1:abc",
		"redis://user:s3cret@127.0.0.1:6379/%zz",
		"redis://:s3cret/x@127.0.0.1:6379",
		"redis://:s3cret#x@127.0.0.1:6379",
		"redis://:s3cret?x@127.0.0.1:6379",
		"redis://:123/s3cret@127.0.0.1:6379",
		"redis://user:s3 cret@127.0.0.1:6379",
		"user:s3cret@127.0.0.1:6379",
		"redis://user:s3cret@127.0.0.1:6379/0?addr=127.0.0.1:1&bogus=1",
		"redis://user:s3cret@127.0.0.1:6379?master_name=m&route_randomly=true",
		"redis://127.0.0.1:6379?password=s3cret&x=\x7f",
	} {
		var out bytes.Buffer
		ready := make(chan string, 1)
		ctx, cancel := context.WithCancel(context.Background())
		err := func() error {
			done := make(chan error, 1)
			go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-redis", u}, &out, ready) }()
			select {
			case err := <-done:
				return err
			case addr := <-ready:
				cancel()
				<-done
				t.Errorf("%q: started on %s", u, addr)
				return nil
			}
		}()
		cancel()
		if err == nil {
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "-redis: ") || strings.Contains(msg, "s3") || strings.Contains(msg, "cret") {
			t.Errorf("%q: error %q, want one starting with -redis: and without the password", u, msg)
		}
		if strings.Contains(out.String(), "s3") {
			t.Errorf("%q: the log shows the password: %s", u, out.String())
		}
	}
}

// A key secret of the wrong length is refused with an error naming the environment
// variable it came from.
func TestBadKeySecretNamesTheVariable(t *testing.T) {
	t.Setenv(keySecretEnv, "short")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-redis", "redis://127.0.0.1:1/0"}, &bytes.Buffer{}, ready)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.HasPrefix(err.Error(), keySecretEnv+": ") {
			t.Fatalf("error %v, want one starting with %s", err, keySecretEnv)
		}
	case addr := <-ready:
		cancel()
		<-done
		t.Fatalf("started on %s with a 5-byte key secret", addr)
	}
}
