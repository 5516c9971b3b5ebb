package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

// TestNodeTLSConfig: a cluster node's connection, to 127.0.0.1, takes a certificate of
// the trusted CA valid for 127.0.0.1 or for the first seed's name, and refuses one
// valid for another name only, one of another CA, and (with no seed name) one valid
// for the seed's name. The handshakes are real TLS over a pipe.
func TestNodeTLSConfig(t *testing.T) {
	ca, caKey := testCert(t, nil, nil, "", nil)
	other, otherKey := testCert(t, nil, nil, "", nil)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	ip := net.IPv4(127, 0, 0, 1)
	for _, c := range []struct {
		name       string
		signer     *x509.Certificate
		key        *ecdsa.PrivateKey
		dns        string
		ip         net.IP
		seed       string
		wantAccept bool
	}{
		{"address", ca, caKey, "", ip, "redis.example", true},
		{"seed's name", ca, caKey, "redis.example", nil, "redis.example", true},
		{"another name", ca, caKey, "other.example", nil, "redis.example", false},
		{"another CA", other, otherKey, "redis.example", ip, "redis.example", false},
		{"no seed name", ca, caKey, "redis.example", nil, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			leaf, leafKey := testCert(t, c.signer, c.key, c.dns, c.ip)
			srvConf := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: leafKey}}}
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			srv := tls.Server(a, srvConf)
			done := make(chan error, 1)
			go func() { done <- srv.Handshake() }()
			cli := tls.Client(b, nodeTLSConfig(&tls.Config{RootCAs: roots, ServerName: c.seed}, "127.0.0.1", c.seed))
			err := cli.Handshake()
			b.Close() // not cli.Close: its close_notify would wait for a reader
			<-done
			if (err == nil) != c.wantAccept {
				t.Fatalf("handshake: %v, want accepted %v", err, c.wantAccept)
			}
		})
	}
}

// testCert makes a CA (signer nil) or a server certificate signed by signer for dns
// (if not "") and ip (if not nil).
func testCert(t *testing.T, signer *x509.Certificate, signerKey *ecdsa.PrivateKey, dns string, ip net.IP) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if dns != "" {
		tmpl.DNSNames = []string{dns}
	}
	if ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	if signer == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.ExtKeyUsage = true, true, nil
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		signer, signerKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}
