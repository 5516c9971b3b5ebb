package main

import (
	"context"
	"errors"

	"github.com/ratebudget/ratebudget"
)

func newRedisLimiter(context.Context, options) (ratebudget.Limiter, func(), error) {
	return nil, nil, errors.New("-redis is not supported yet")
}
