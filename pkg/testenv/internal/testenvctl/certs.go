package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certs writes, into args[0], a certificate authority made for this
// environment only and certificates it signs, all PEM:
//
//	ca.pem                  the CA certificate (what clients trust)
//	server.pem, server.key  for 127.0.0.1 and localhost (PostgreSQL)
//	server-keystore.pem     the server key and certificate in one file
//	                        (Kafka's ssl.keystore.type=PEM)
//	client.pem, client.key  a client certificate (CN pgoutbox-client)
//
// Keys are unencrypted PKCS#8 ECDSA P-256, readable by the owner only.
// The CA's own key is never written: nothing else can be signed later.
// They are valid for 30 days; an environment lives for minutes.
func certs(args []string) error {
	if len(args) != 1 {
		usage()
	}
	dir := args[0]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "pgoutbox test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "ca.pem"), 0o644, pemBlock("CERTIFICATE", caDER)); err != nil {
		return err
	}

	leaf := func(name string, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(30 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		cert, k := pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER)
		if err := writePEM(filepath.Join(dir, name+".pem"), 0o644, cert); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, name+".key"), 0o600, k); err != nil {
			return err
		}
		if name == "server" {
			return writePEM(filepath.Join(dir, "server-keystore.pem"), 0o600, k, cert)
		}
		return nil
	}
	if err := leaf("server", "127.0.0.1", x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"}); err != nil {
		return err
	}
	return leaf("client", "pgoutbox-client", x509.ExtKeyUsageClientAuth, nil, nil)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// writePEM writes the blocks to path with mode, through a temporary file.
func writePEM(path string, mode os.FileMode, blocks ...[]byte) error {
	tmp := path + ".tmp"
	var data []byte
	for _, b := range blocks {
		data = append(data, b...)
	}
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil { // WriteFile's mode is masked by the umask
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}
