// Package bound holds the bounds that keep every value of a budget exact in a Redis Lua
// number (a float64, exact below 2^53): one definition, which the root package's
// validation and the packages that check or clamp values against it share.
package bound

// MaxLimit is the largest accepted Rule.Limit, Rule.Burst and Check.Cost, and the largest
// cost a settle may charge: 2^40 (1,099,511,627,776) cost units.
const MaxLimit = 1 << 40

// MaxScaled bounds a token bucket's capacity × Window in ms, the scale of its exact
// refill arithmetic: 2^53, the largest integer below which a float64 is exact.
const MaxScaled = 1 << 53
