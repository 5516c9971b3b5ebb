//go:build !race

package lua_test

const raceEnabled = false
