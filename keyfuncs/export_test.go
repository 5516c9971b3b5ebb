package keyfuncs

import "net/netip"

// Unexported bounds and helpers, for the external tests that check them.
const (
	MaxValueLen  = maxValueLen
	MaxJoinedLen = maxJoinedLen
	HashedLen    = hashedLen
)

var JoinStrings = joinStrings

// GroupIP is the key ClientIP gives addr under the default grouping (IPv4 as it is, IPv6
// by its /64), or "" for an invalid addr.
func GroupIP(addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	return groupAddr(normalize(addr), 32, 64, "")
}
