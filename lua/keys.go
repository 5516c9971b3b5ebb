package lua

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"

	"github.com/ratebudget/ratebudget"
)

// digestLen is the length of an encoded digest: 16 bytes in unpadded base64url.
const digestLen = 22

// Domain tags keep an identity's digest distinct from a scope's digest of the same bytes.
const (
	tagIdentity = 'i'
	tagScope    = 's'
)

// appendDigest appends the base64url encoding of the first 128 bits of
// SHA-256("ratebudget" || tag || uvarint(len(s)) || s) to dst. scratch is a reusable
// buffer, returned grown.
func appendDigest(dst, scratch []byte, tag byte, s string) ([]byte, []byte) {
	scratch = append(scratch[:0], "ratebudget"...)
	scratch = append(scratch, tag)
	scratch = binary.AppendUvarint(scratch, uint64(len(s)))
	scratch = append(scratch, s...)
	sum := sha256.Sum256(scratch)
	return base64.RawURLEncoding.AppendEncode(dst, sum[:16]), scratch
}

// appendKey appends the budget key of c to dst:
// <prefix>:{<identity digest>}:<rule name>:<algorithm>[:<scope digest>].
// It returns the key, the hash slot of its tag and the scratch buffer.
func appendKey(dst, scratch []byte, prefix string, c *ratebudget.Check) ([]byte, uint16, []byte) {
	dst = append(dst, prefix...)
	dst = append(dst, ":{"...)
	start := len(dst)
	dst, scratch = appendDigest(dst, scratch, tagIdentity, c.Identity)
	slot := keySlot(dst[start:])
	dst = append(dst, "}:"...)
	dst = append(dst, c.Rule.Name...)
	dst = append(dst, ':')
	dst = append(dst, c.Rule.Algorithm.String()...)
	if c.Scope != "" {
		dst = append(dst, ':')
		dst, scratch = appendDigest(dst, scratch, tagScope, c.Scope)
	}
	return dst, slot, scratch
}

// keySlot is the Redis Cluster hash slot of a hash tag: CRC16 (XMODEM) mod 16384.
func keySlot(tag []byte) uint16 {
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
