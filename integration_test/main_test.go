// Package integration_test checks the Redis limiter against a real Redis server started
// in a container by testcontainers-go: one container for the whole package, a unique key
// prefix per test, and no test ever flushes the server.
//
// Without a reachable Docker engine, or when the image cannot be started, the tests skip
// with the reason, unless RATEBUDGET_REQUIRE_REDIS=1. The image is REDIS_IMAGE (default
// redis:7, which needs a registry); .ci/redis-image.sh builds one locally, and `make
// test` builds and uses it wherever a Docker engine answers.
package integration_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"

	"github.com/ratebudget/ratebudget/lua"
)

// helperEnv marks a child process started by TestCrossProcess.
const helperEnv = "RATEBUDGET_INTEGRATION_HELPER"

// redisAddr is the container's address ("host:port"), or "" with unavailable saying why.
var redisAddr, unavailable string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(m.Run())
	}
	setDefault("TESTCONTAINERS_RYUK_DISABLED", "true")      // the reaper image cannot be pulled here
	setDefault("TESTCONTAINERS_HOST_OVERRIDE", "localhost") // dial published ports on localhost
	os.Exit(run(m))
}

func setDefault(key, value string) {
	if _, ok := os.LookupEnv(key); !ok {
		os.Setenv(key, value)
	}
}

func run(m *testing.M) int {
	stop, err := startRedis()
	if err != nil {
		unavailable = err.Error()
	} else {
		defer stop()
	}
	return m.Run()
}

func startRedis() (stop func(), err error) {
	defer func() {
		if r := recover(); r != nil { // testcontainers panics on some provider failures
			err = fmt.Errorf("no Docker engine found (testcontainers: %v)", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return nil, fmt.Errorf("no Docker engine found (install one, or set DOCKER_HOST): %w", err)
	}
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	err = provider.Health(hctx)
	hcancel()
	provider.Close()
	if err != nil {
		return nil, fmt.Errorf("the Docker engine does not answer: %w", err)
	}
	ctr, image, err := runRedisContainer(ctx)
	stop = func() {
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("the Docker engine answers, but a container of image %s did not start "+
			"(an image that needs no registry: `make redis-image` builds ratebudget-test/redis:local from the host's redis-server, "+
			"and `make test` builds and uses it): %w", image, err)
	}
	url, err := ctr.ConnectionString(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		stop()
		return nil, err
	}
	redisAddr = opts.Addr
	return stop, nil
}

// requireRedis skips (or, with RATEBUDGET_REQUIRE_REDIS=1, fails) the test when no
// Redis container could be started.
func requireRedis(tb testing.TB) {
	tb.Helper()
	if redisAddr != "" {
		return
	}
	msg := "no Redis container for the integration tests: " + unavailable
	if os.Getenv("RATEBUDGET_REQUIRE_REDIS") == "1" {
		tb.Fatal("RATEBUDGET_REQUIRE_REDIS=1 and " + msg)
	}
	tb.Skip(msg)
}

// newClient returns a client of the shared container with the options recommended for
// the limiter, closed when the test ends.
func newClient(tb testing.TB, poolSize int) *redis.Client {
	tb.Helper()
	requireRedis(tb)
	c := redis.NewClient(clientOptions(redisAddr, poolSize))
	tb.Cleanup(func() { c.Close() })
	return c
}

func clientOptions(addr string, poolSize int) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		PoolSize:              poolSize,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		PoolTimeout:           3 * time.Second,
	}
}

var prefixSeq atomic.Int64

// uniquePrefix is a key prefix no other test (or earlier run on the same server) uses.
func uniquePrefix(tb testing.TB) string {
	return fmt.Sprintf("it%x.%d", time.Now().UnixNano(), prefixSeq.Add(1))
}

func newLimiter(tb testing.TB, c redis.Scripter) *lua.Limiter {
	tb.Helper()
	l, _ := newPrefixed(tb, c)
	return l
}

// newPrefixed is newLimiter, also returning the limiter's key prefix.
func newPrefixed(tb testing.TB, c redis.Scripter) (*lua.Limiter, string) {
	tb.Helper()
	prefix := uniquePrefix(tb)
	l, err := lua.New(c, lua.WithPrefix(prefix))
	if err != nil {
		tb.Fatal(err)
	}
	return l, prefix
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return ctx
}
