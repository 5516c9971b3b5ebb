package integration_test

import (
	"context"
	"os"

	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
)

// runRedisContainer starts a Redis container of REDIS_IMAGE (default redis:7) and waits
// until it accepts connections. The shared container of TestMain and the dedicated ones
// of the fault tests start the same way.
func runRedisContainer(ctx context.Context) (ctr *tcredis.RedisContainer, image string, err error) {
	image = os.Getenv("REDIS_IMAGE")
	if image == "" {
		image = "redis:7"
	}
	ctr, err = tcredis.Run(ctx, image, testcontainers.WithWaitStrategy(
		wait.ForListeningPort("6379/tcp").SkipInternalCheck(),
		wait.ForLog("Ready to accept connections"),
	))
	return ctr, image, err
}
