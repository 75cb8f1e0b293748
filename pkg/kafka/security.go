package kafka

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"github.com/pgoutbox/pgoutbox/pkg/secret"
)

// Security protocols, named as Kafka's security.protocol.
const (
	ProtocolPlaintext     = "PLAINTEXT"
	ProtocolSSL           = "SSL"
	ProtocolSASLPlaintext = "SASL_PLAINTEXT"
	ProtocolSASLSSL       = "SASL_SSL"
)

// SASL mechanisms, named as Kafka's sasl.mechanism.
const (
	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// Values of ssl.endpoint.identification.algorithm.
const (
	EndpointIdentificationHTTPS = "https" // check the broker's name against its certificate
	EndpointIdentificationNone  = "none"  // check the chain only
)

// Security is the part of [Config] about encryption and authentication. The
// option names follow the Java client's (and so Debezium's and Kafka
// Connect's): security.protocol, sasl.mechanism, ssl.ca.location, ...
type Security struct {
	// Protocol is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (case does
	// not matter). Default PLAINTEXT.
	Protocol string `yaml:"security.protocol"`

	// SASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; required with
	// the SASL protocols. PLAIN sends the password as it is: use it over
	// SASL_SSL only.
	SASLMechanism string `yaml:"sasl.mechanism"`
	// SASLUsername and the password authenticate the client. Give the
	// password either inline (better from the environment:
	// PGOUTBOX_KAFKA_SASL_PASSWORD) or as a file that holds it, such as a
	// mounted secret; a trailing newline in the file is ignored. The file
	// is read whenever a connection is configured, so a rotated secret is
	// picked up by the next session.
	SASLUsername     string `yaml:"sasl.username"`
	SASLPassword     string `yaml:"sasl.password"`
	SASLPasswordFile string `yaml:"sasl.password.file"`

	// SSLCALocation is a PEM file of the certificate authorities to trust;
	// empty means the system's.
	SSLCALocation string `yaml:"ssl.ca.location"`
	// SSLCertificateLocation and SSLKeyLocation are a PEM client
	// certificate (chain) and its unencrypted private key, for brokers that
	// authenticate clients by certificate. Both or neither.
	SSLCertificateLocation string `yaml:"ssl.certificate.location"`
	SSLKeyLocation         string `yaml:"ssl.key.location"`
	// SSLEndpointIdentification is "https" (check that the certificate
	// names the broker's host) or "none" (check only that a trusted CA
	// signed it). Default https.
	SSLEndpointIdentification string `yaml:"ssl.endpoint.identification.algorithm"`
	// SSLInsecureSkipVerify accepts any certificate at all. For tests only:
	// anyone on the path can then read and change the traffic.
	SSLInsecureSkipVerify bool `yaml:"ssl.insecure.skip.verify"`
}

func (s *Security) defaults() {
	setDefault(&s.Protocol, ProtocolPlaintext)
	setDefault(&s.SSLEndpointIdentification, EndpointIdentificationHTTPS)
}

func (s *Security) protocol() string { return strings.ToUpper(strings.TrimSpace(s.Protocol)) }

func (s *Security) usesTLS() bool {
	p := s.protocol()
	return p == ProtocolSSL || p == ProtocolSASLSSL
}

func (s *Security) usesSASL() bool {
	p := s.protocol()
	return p == ProtocolSASLPlaintext || p == ProtocolSASLSSL
}

// validate checks a defaulted Security, reading the files it names, and
// returns one error per problem, each naming its option. It never quotes a
// password.
func (s *Security) validate() []error {
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, fmt.Errorf("kafka: %s: %s", option, fmt.Sprintf(format, args...)))
	}
	switch s.protocol() {
	case ProtocolPlaintext, ProtocolSSL, ProtocolSASLPlaintext, ProtocolSASLSSL:
	default:
		bad("security.protocol", "%q is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL", s.Protocol)
		return errs
	}
	if s.usesSASL() {
		switch s.mechanism() {
		case MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512:
		case "":
			bad("sasl.mechanism", "is required with security.protocol %s: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.protocol())
		default:
			bad("sasl.mechanism", "%q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.SASLMechanism)
		}
		if s.SASLUsername == "" {
			bad("sasl.username", "is required with security.protocol %s", s.protocol())
		}
		switch {
		case s.SASLPassword != "" && s.SASLPasswordFile != "":
			bad("sasl.password", "set either sasl.password or sasl.password.file, not both")
		case s.SASLPassword == "" && s.SASLPasswordFile == "":
			bad("sasl.password", "is required with security.protocol %s (or give sasl.password.file)", s.protocol())
		case s.SASLPasswordFile != "":
			if _, err := s.password(); err != nil {
				errs = append(errs, err)
			}
		}
	} else {
		for _, o := range []struct{ option, v string }{
			{"sasl.mechanism", s.SASLMechanism},
			{"sasl.username", s.SASLUsername},
			{"sasl.password", s.SASLPassword},
			{"sasl.password.file", s.SASLPasswordFile},
		} {
			if o.v != "" {
				bad(o.option, "is set, but security.protocol %s does not use SASL: use SASL_SSL (or SASL_PLAINTEXT)", s.protocol())
			}
		}
	}
	switch s.SSLEndpointIdentification {
	case EndpointIdentificationHTTPS, EndpointIdentificationNone:
	default:
		bad("ssl.endpoint.identification.algorithm", "%q is not https or none", s.SSLEndpointIdentification)
	}
	if s.usesTLS() {
		if (s.SSLCertificateLocation == "") != (s.SSLKeyLocation == "") {
			bad("ssl.certificate.location", "give both ssl.certificate.location and ssl.key.location, or neither")
		} else if _, err := s.tlsConfig(); err != nil {
			errs = append(errs, err)
		}
	} else {
		for _, o := range []struct{ option, v string }{
			{"ssl.ca.location", s.SSLCALocation},
			{"ssl.certificate.location", s.SSLCertificateLocation},
			{"ssl.key.location", s.SSLKeyLocation},
		} {
			if o.v != "" {
				bad(o.option, "is set, but security.protocol %s does not use TLS: use SSL or SASL_SSL", s.protocol())
			}
		}
	}
	return errs
}

func (s *Security) mechanism() string { return strings.ToUpper(strings.TrimSpace(s.SASLMechanism)) }

// password returns the SASL password, reading sasl.password.file if set.
func (s *Security) password() (string, error) {
	if s.SASLPasswordFile == "" {
		return s.SASLPassword, nil
	}
	return secret.ReadFile("kafka: sasl.password.file", s.SASLPasswordFile)
}

// tlsConfig builds the client's TLS configuration from the files.
func (s *Security) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.SSLCALocation != "" {
		pem, err := os.ReadFile(s.SSLCALocation)
		if err != nil {
			return nil, fmt.Errorf("kafka: ssl.ca.location: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka: ssl.ca.location: %s holds no PEM certificate", s.SSLCALocation)
		}
		tc.RootCAs = pool
	}
	if s.SSLCertificateLocation != "" {
		cert, err := tls.LoadX509KeyPair(s.SSLCertificateLocation, s.SSLKeyLocation)
		if err != nil {
			return nil, fmt.Errorf("kafka: ssl.certificate.location %s with ssl.key.location %s: %w", s.SSLCertificateLocation, s.SSLKeyLocation, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	switch {
	case s.SSLInsecureSkipVerify:
		tc.InsecureSkipVerify = true
	case s.SSLEndpointIdentification == EndpointIdentificationNone:
		// crypto/tls checks the name along with the chain; to check only
		// the chain, skip its check and verify the chain here.
		tc.InsecureSkipVerify = true
		roots := tc.RootCAs
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the broker sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return tc, nil
}

// apply sets sarama's Net.TLS and Net.SASL from a defaulted, valid Security.
func (s *Security) apply(sc *sarama.Config) error {
	if s.usesTLS() {
		tc, err := s.tlsConfig()
		if err != nil {
			return err
		}
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = tc
	}
	if !s.usesSASL() {
		return nil
	}
	pw, err := s.password()
	if err != nil {
		return err
	}
	sasl := &sc.Net.SASL
	sasl.Enable = true
	sasl.Handshake = true
	sasl.Version = sarama.SASLHandshakeV1 // Kafka 4 has no v0
	sasl.User = s.SASLUsername
	sasl.Password = pw
	switch s.mechanism() {
	case MechanismPlain:
		sasl.Mechanism = sarama.SASLTypePlaintext
	case MechanismSCRAMSHA256:
		sasl.Mechanism = sarama.SASLTypeSCRAMSHA256
		sasl.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{gen: scram.HashGeneratorFcn(sha256.New)} }
	case MechanismSCRAMSHA512:
		sasl.Mechanism = sarama.SASLTypeSCRAMSHA512
		sasl.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{gen: scram.HashGeneratorFcn(sha512.New)} }
	default:
		return fmt.Errorf("kafka: sasl.mechanism: %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.SASLMechanism)
	}
	return nil
}

// scramClient adapts xdg-go/scram's client conversation to sarama's
// SCRAMClient. sarama makes one per connection and uses it from one
// goroutine.
type scramClient struct {
	gen  scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.gen.NewClient(user, password, authzID)
	if err != nil {
		// Its error is about the user name's or password's characters
		// (SASLprep); it does not quote them.
		return fmt.Errorf("kafka: SCRAM: %w", err)
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }

func (c *scramClient) Done() bool { return c.conv.Done() }

// authError turns a broker's SASL rejection into an error that says what to
// check; other errors are returned as they are.
func (s *Security) authError(addr string, err error) error {
	if !errors.Is(err, sarama.ErrSASLAuthenticationFailed) && !errors.Is(err, sarama.ErrUnsupportedSASLMechanism) {
		return err
	}
	return &AuthError{Broker: addr, Mechanism: s.mechanism(), Username: s.SASLUsername, Err: err}
}

// AuthError is a broker's refusal of the client's SASL credentials or
// mechanism. It never holds the password.
type AuthError struct {
	Broker    string
	Mechanism string
	Username  string
	Err       error
}

func (e *AuthError) Error() string {
	if errors.Is(e.Err, sarama.ErrUnsupportedSASLMechanism) {
		return fmt.Sprintf("kafka: broker %s does not accept SASL mechanism %s: check kafka.sasl.mechanism against the broker's sasl.enabled.mechanisms (%v)",
			e.Broker, e.Mechanism, e.Err)
	}
	return fmt.Sprintf("kafka: broker %s rejected SASL authentication with mechanism %s as user %q: check kafka.sasl.username and kafka.sasl.password (or kafka.sasl.password.file) (%v)",
		e.Broker, e.Mechanism, e.Username, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }
