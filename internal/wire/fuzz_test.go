package wire

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzReadReply: any byte stream from the server yields a reply or an error, never a
// panic, and a corrupt length never allocates more than the bytes that arrived (plus a
// bounded chunk).
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{
		":1\r\n", "+OK\r\n", "-ERR x\r\n", "$3\r\nabc\r\n", "$-1\r\n", "*-1\r\n",
		"*2\r\n:1\r\n$1\r\na\r\n", "*1\r\n*1\r\n-E\r\n", "$999999999\r\nab", "*999999999\r\n",
		"$3\r\nabcd\r\n", ":-\r\n", ":99999999999999999999\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(b), 64)
		for range 4 {
			if _, err := readReply(br); err != nil {
				return
			}
		}
	})
}
