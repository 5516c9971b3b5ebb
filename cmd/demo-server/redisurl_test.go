package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// Timeouts and retries a -redis URL sets (dial_timeout, read_timeout, write_timeout,
// pool_timeout, max_retries) are kept, in each of the URL's forms; the demo's own
// settings (-store-timeout, at least 100 ms; no retries) apply to those it leaves out.
func TestRedisURLKeepsItsTimeoutsAndRetries(t *testing.T) {
	const query = "dial_timeout=3s&read_timeout=4s&write_timeout=5s&pool_timeout=6s&max_retries=2"
	type got struct {
		dial, read, write, pool time.Duration
		retries                 int
		ctxTimeout              bool
	}
	of := func(t *testing.T, c redis.UniversalClient) got {
		t.Helper()
		defer c.Close()
		switch c := c.(type) {
		case *redis.Client:
			o := c.Options()
			return got{o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MaxRetries, o.ContextTimeoutEnabled}
		case *redis.ClusterClient:
			o := c.Options()
			return got{o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MaxRetries, o.ContextTimeoutEnabled}
		}
		t.Fatalf("client %T", c)
		return got{}
	}
	none := func(g got) got { // go-redis reads MaxRetries -1 (none) as 0 for one server
		g.retries = max(g.retries, 0)
		return g
	}
	kept := got{3 * time.Second, 4 * time.Second, 5 * time.Second, 6 * time.Second, 2, true}
	dflt := got{200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond, -1, true}
	for _, base := range []string{
		"redis://127.0.0.1:6379/0",
		"redis://127.0.0.1:7000?addr=127.0.0.1:7001",
		"redis://127.0.0.1:26379?master_name=m&addr=127.0.0.1:26380",
	} {
		for _, c := range []struct {
			url  string
			want got
		}{
			{base, dflt},
			{base + map[bool]string{true: "&", false: "?"}[strings.Contains(base, "?")] + query, kept},
		} {
			newClient, _, asCluster, err := parseRedisURL(c.url, 200*time.Millisecond)
			if err != nil {
				t.Fatalf("%s: %v", c.url, err)
			}
			if g := of(t, newClient()); none(g) != none(c.want) {
				t.Errorf("%s: client settings %+v, want %+v", c.url, g, c.want)
			}
			if asCluster != nil {
				if g := of(t, asCluster()); none(g) != none(c.want) {
					t.Errorf("%s: as a cluster's seed, client settings %+v, want %+v", c.url, g, c.want)
				}
			}
		}
	}
}
