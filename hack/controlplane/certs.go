package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// credentials are the files a fresh control plane needs: a CA, the API server's
// serving cert (for 127.0.0.1 and the in-cluster names), an admin client cert in
// system:masters, a static admin bearer token (for plain HTTP clients in the tests),
// and the service-account signing key pair.
type credentials struct {
	caCert, caKey           string
	servingCert, servingKey string
	clientCert, clientKey   string
	saKey, saPub            string
	tokenFile, token        string
}

func writeCredentials(dir string) (*credentials, error) {
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	c := &credentials{
		caCert: filepath.Join(pki, "ca.crt"), caKey: filepath.Join(pki, "ca.key"),
		servingCert: filepath.Join(pki, "apiserver.crt"), servingKey: filepath.Join(pki, "apiserver.key"),
		clientCert: filepath.Join(pki, "admin.crt"), clientKey: filepath.Join(pki, "admin.key"),
		saKey: filepath.Join(pki, "sa.key"), saPub: filepath.Join(pki, "sa.pub"),
		tokenFile: filepath.Join(pki, "tokens.csv"),
	}
	now := time.Now().Add(-time.Hour) // tolerate small clock skew between processes
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpuslice-e2e-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	if err := writePEM(c.caCert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	if err := writeKey(c.caKey, caKey); err != nil {
		return nil, err
	}

	issue := func(certPath, keyPath string, serial int64, tmpl *x509.Certificate) error {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now, now.Add(7*24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writeKey(keyPath, k)
	}
	if err := issue(c.servingCert, c.servingKey, 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.96.0.1")},
	}); err != nil {
		return nil, err
	}
	if err := issue(c.clientCert, c.clientKey, 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "gpuslice-e2e-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}

	// The API server signs service-account tokens with this key; RSA because every
	// verifier supports it.
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(c.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(c.saPub, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	c.token = hex.EncodeToString(tok)
	line := fmt.Sprintf("%s,gpuslice-e2e-admin,gpuslice-e2e-admin,\"system:masters\"\n", c.token)
	if err := os.WriteFile(c.tokenFile, []byte(line), 0o600); err != nil {
		return nil, err
	}
	return c, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}
