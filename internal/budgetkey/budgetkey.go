// Package budgetkey builds the Redis keys of package lua's budgets: the one definition
// of their layout, <prefix>:{<identity digest>}:<rule name>:<algorithm>[:<scope digest>],
// which package lua decides with and the tests of other packages (the middleware's,
// the integration tests) read budgets by. A Keyer is safe for concurrent use.
package budgetkey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
)

// DigestLen is the length of an encoded digest: 16 bytes in unpadded base64url.
const DigestLen = 22

// Domain tags keep an identity's digest distinct from a scope's digest of the same bytes.
const (
	tagIdentity = 'i'
	tagScope    = 's'
)

// Keyer builds budget keys. With a secret, digests are HMAC-SHA-256 keyed by it, so
// that nobody without the secret can predict which hash slot an identity lands in.
type Keyer struct {
	prefix string
	macs   *sync.Pool // of hash.Hash keyed by the secret; nil: unkeyed SHA-256
}

// New returns the Keyer of a limiter of prefix (lua.WithPrefix, "rb" by default) and
// secret (lua.WithKeySecret, nil without), which it copies.
func New(prefix string, secret []byte) Keyer {
	k := Keyer{prefix: prefix}
	if secret != nil {
		secret := append([]byte(nil), secret...)
		k.macs = &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}
	}
	return k
}

// appendDigest appends the base64url encoding of the first 128 bits of
// SHA-256("ratebudget" || tag || uvarint(len(s)) || s), or of its HMAC under the
// secret, to dst. scratch is a reusable buffer, returned grown.
func (k Keyer) appendDigest(dst, scratch []byte, tag byte, s string) ([]byte, []byte) {
	scratch = append(scratch[:0], "ratebudget"...)
	scratch = append(scratch, tag)
	scratch = binary.AppendUvarint(scratch, uint64(len(s)))
	scratch = append(scratch, s...)
	var sum [sha256.Size]byte
	if k.macs == nil {
		sum = sha256.Sum256(scratch)
	} else {
		h := k.macs.Get().(hash.Hash)
		h.Reset()
		h.Write(scratch)
		h.Sum(sum[:0])
		k.macs.Put(h)
	}
	return base64.RawURLEncoding.AppendEncode(dst, sum[:16]), scratch
}

// Append appends the budget key of c to dst:
// <prefix>:{<identity digest>}:<rule name>:<algorithm>[:<scope digest>].
// It returns the key, the hash slot of its tag and the scratch buffer, a reusable
// buffer returned grown.
func (k Keyer) Append(dst, scratch []byte, c *ratebudget.Check) ([]byte, uint16, []byte) {
	dst = append(dst, k.prefix...)
	dst = append(dst, ":{"...)
	start := len(dst)
	dst, scratch = k.appendDigest(dst, scratch, tagIdentity, c.Identity)
	slot := Slot(dst[start:])
	dst = append(dst, "}:"...)
	dst = append(dst, c.Rule.Name...)
	dst = append(dst, ':')
	dst = append(dst, algname.Of(c.Rule.Algorithm)...)
	if c.Scope != "" {
		dst = append(dst, ':')
		dst, scratch = k.appendDigest(dst, scratch, tagScope, c.Scope)
	}
	return dst, slot, scratch
}

// Key is the budget key of c, as a string: for tests and tools, which read a budget's
// state in Redis.
func (k Keyer) Key(c ratebudget.Check) string {
	key, _, _ := k.Append(nil, nil, &c)
	return string(key)
}

// Slot is the Redis Cluster hash slot of a hash tag: CRC16 (XMODEM) mod 16384.
func Slot(tag []byte) uint16 {
	var crc uint16
	for _, b := range tag {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^b]
	}
	return crc & 16383
}

// crc16Table holds CRC16 (XMODEM, polynomial 0x1021) of every byte value.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
