package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test, with a certificate it signed
// for the servers (for 127.0.0.1 and localhost, usable as a server's and as a
// client's, as the cluster bus needs) and one for clients. Its files are in the test's
// temporary directory.
type testCA struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
	client                    tls.Certificate
	// leaf makes a certificate the CA signs, for 127.0.0.1 and the names dns.
	leaf func(serial int64, name string, dns []string, usage ...x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey)
}

// ipOnly returns a copy of ca whose servers' certificate (another one, signed by the
// same CA) names 127.0.0.1 only, not localhost: a client that checks it against the
// name localhost fails.
func (ca *testCA) ipOnly(tb testing.TB) *testCA {
	tb.Helper()
	dir := tb.TempDir()
	c := *ca
	c.certFile, c.keyFile = filepath.Join(dir, "server-ip.pem"), filepath.Join(dir, "server-ip-key.pem")
	der, key := ca.leaf(4, "redistest server by address", nil, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	writePEM(tb, c.certFile, "CERTIFICATE", der)
	writePEM(tb, c.keyFile, "PRIVATE KEY", pkcs8(tb, key))
	return &c
}

// newCA makes a CA and its two certificates with ECDSA P-256 keys, valid from an hour
// ago for a day.
func newCA(tb testing.TB) *testCA {
	tb.Helper()
	dir := tb.TempDir()
	caKey := newKey(tb)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("redistest: CA certificate: %v", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatal(err)
	}
	ca := &testCA{
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server-key.pem"),
		pool:     x509.NewCertPool(),
	}
	ca.leaf = func(serial int64, name string, dns []string, usage ...x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key := newKey(tb)
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
			DNSNames:     dns,
		}, caCert, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatalf("redistest: %s certificate: %v", name, err)
		}
		return der, key
	}
	ca.pool.AddCert(caCert)
	srvDER, srvKey := ca.leaf(2, "redistest server", []string{"localhost"}, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	writePEM(tb, ca.caFile, "CERTIFICATE", caDER)
	writePEM(tb, ca.certFile, "CERTIFICATE", srvDER)
	writePEM(tb, ca.keyFile, "PRIVATE KEY", pkcs8(tb, srvKey))
	cliDER, cliKey := ca.leaf(3, "redistest client", []string{"localhost"}, x509.ExtKeyUsageClientAuth)
	ca.client = tls.Certificate{Certificate: [][]byte{cliDER}, PrivateKey: cliKey}
	return ca
}

// args returns the server's TLS settings: TLS only on port, its certificate, and
// clients' certificates verified against the CA when they give one (tls-auth-clients
// no; args given after these override them).
func (ca *testCA) args(port string) []string {
	return []string{"--port", "0", "--tls-port", port,
		"--tls-cert-file", ca.certFile, "--tls-key-file", ca.keyFile,
		"--tls-ca-cert-file", ca.caFile, "--tls-auth-clients", "no"}
}

// clientConfig returns a client's TLS settings: the CA as its only root, and the
// client certificate.
func (ca *testCA) clientConfig() *tls.Config {
	return &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{ca.client}, MinVersion: tls.VersionTLS12}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func pkcs8(tb testing.TB, k *ecdsa.PrivateKey) []byte {
	tb.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		tb.Fatal(err)
	}
	return der
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// StartTLS is [Start] for a server that speaks TLS only: Addr is its TLS port, with a
// certificate for 127.0.0.1 signed by a CA made for the test, whose PEM file is
// CAFile. Clients need not give a certificate (tls-auth-clients no; args may set
// "--tls-auth-clients", "yes"). [Server.Client] and [Server.TLSConfig] trust that CA
// and give a client certificate it signed.
func StartTLS(tb testing.TB, args ...string) *Server {
	tb.Helper()
	return startWith(tb, "", newCA(tb), args)
}

// TLSConfig returns a new copy of the TLS settings s's clients use: the test's CA as
// the only root and a client certificate it signed. It is nil for a server started
// without TLS.
func (s *Server) TLSConfig() *tls.Config {
	if s.ca == nil {
		return nil
	}
	return s.ca.clientConfig()
}
