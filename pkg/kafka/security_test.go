package kafka

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"go.yaml.in/yaml/v3"
)

func TestSecurityOptionsDecodeWithKafkasNames(t *testing.T) {
	var c Config
	doc := `
brokers: [b:9093]
security.protocol: SASL_SSL
sasl.mechanism: SCRAM-SHA-512
sasl.username: app
sasl.password: s3cret-pw
ssl.ca.location: /etc/ca.pem
ssl.endpoint.identification.algorithm: none
`
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	want := Security{Protocol: "SASL_SSL", SASLMechanism: "SCRAM-SHA-512", SASLUsername: "app", SASLPassword: "s3cret-pw",
		SSLCALocation: "/etc/ca.pem", SSLEndpointIdentification: "none"}
	if c.Security != want {
		t.Fatalf("decoded %+v, want %+v", c.Security, want)
	}
}

func TestSecurityValidateNamesTheOption(t *testing.T) {
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	sasl := Security{Protocol: "SASL_SSL", SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "p"}
	for _, tc := range []struct {
		name string
		sec  Security
		want string // substring of the error; "" for valid
	}{
		{"plaintext default", Security{}, ""},
		{"sasl ssl", sasl, ""},
		{"lower case names", Security{Protocol: "sasl_ssl", SASLMechanism: "scram-sha-256", SASLUsername: "u", SASLPassword: "p"}, ""},
		{"password file", Security{Protocol: "SASL_PLAINTEXT", SASLMechanism: "PLAIN", SASLUsername: "u", SASLPasswordFile: pwFile}, ""},
		{"protocol", Security{Protocol: "TLS"}, `kafka: security.protocol: "TLS" is not one of`},
		{"no mechanism", Security{Protocol: "SASL_SSL", SASLUsername: "u", SASLPassword: "p"}, "kafka: sasl.mechanism: is required"},
		{"bad mechanism", Security{Protocol: "SASL_SSL", SASLMechanism: "GSSAPI", SASLUsername: "u", SASLPassword: "p"}, `kafka: sasl.mechanism: "GSSAPI" is not one of`},
		{"no user", Security{Protocol: "SASL_SSL", SASLMechanism: "PLAIN", SASLPassword: "p"}, "kafka: sasl.username: is required"},
		{"no password", Security{Protocol: "SASL_SSL", SASLMechanism: "PLAIN", SASLUsername: "u"}, "kafka: sasl.password: is required"},
		{"both passwords", Security{Protocol: "SASL_SSL", SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "p", SASLPasswordFile: pwFile}, "not both"},
		{"missing password file", Security{Protocol: "SASL_SSL", SASLMechanism: "PLAIN", SASLUsername: "u", SASLPasswordFile: filepath.Join(dir, "nope")},
			"kafka: sasl.password.file: cannot read the password file: open " + filepath.Join(dir, "nope")},
		{"empty password file", Security{Protocol: "SASL_SSL", SASLMechanism: "PLAIN", SASLUsername: "u", SASLPasswordFile: empty}, "kafka: sasl.password.file: the password file " + empty + " is empty"},
		{"sasl without protocol", Security{SASLUsername: "u"}, "kafka: sasl.username: is set, but security.protocol PLAINTEXT does not use SASL"},
		{"ssl without protocol", Security{Protocol: "SASL_PLAINTEXT", SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "p", SSLCALocation: notPEM}, "kafka: ssl.ca.location: is set, but security.protocol SASL_PLAINTEXT does not use TLS"},
		{"ca not PEM", Security{Protocol: "SSL", SSLCALocation: notPEM}, "kafka: ssl.ca.location: " + notPEM + " holds no PEM certificate"},
		{"ca missing", Security{Protocol: "SSL", SSLCALocation: filepath.Join(dir, "nope.pem")}, "kafka: ssl.ca.location: open "},
		{"cert without key", Security{Protocol: "SSL", SSLCertificateLocation: notPEM}, "kafka: ssl.certificate.location: give both"},
		{"bad cert", Security{Protocol: "SSL", SSLCertificateLocation: notPEM, SSLKeyLocation: notPEM}, "kafka: ssl.certificate.location " + notPEM},
		{"endpoint identification", Security{Protocol: "SSL", SSLEndpointIdentification: "dns"}, `kafka: ssl.endpoint.identification.algorithm: "dns" is not https or none`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Brokers: []string{"b:9092"}, Security: tc.sec}
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Fatalf("error quotes the password: %v", err)
			}
		})
	}
}

func TestSecurityMapsOntoSarama(t *testing.T) {
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("from-file\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Config{Brokers: []string{"b:9092"}, Security: Security{Protocol: "sasl_ssl", SASLMechanism: "SCRAM-SHA-256", SASLUsername: "u", SASLPasswordFile: pwFile}}
	c.Defaults()
	sc, err := c.sarama()
	if err != nil {
		t.Fatal(err)
	}
	s := sc.Net.SASL
	if !sc.Net.TLS.Enable || sc.Net.TLS.Config == nil || sc.Net.TLS.Config.InsecureSkipVerify {
		t.Errorf("TLS: enable %v config %+v", sc.Net.TLS.Enable, sc.Net.TLS.Config)
	}
	if !s.Enable || s.Mechanism != sarama.SASLTypeSCRAMSHA256 || s.User != "u" || s.Password != "from-file" || s.SCRAMClientGeneratorFunc == nil || s.Version != sarama.SASLHandshakeV1 {
		t.Errorf("SASL: %+v", s)
	}
	// The SCRAM client starts a conversation (the client-first message
	// names the user).
	cl := s.SCRAMClientGeneratorFunc()
	if err := cl.Begin("u", "from-file", ""); err != nil {
		t.Fatal(err)
	}
	first, err := cl.Step("")
	if err != nil || !strings.HasPrefix(first, "n,,n=u,r=") {
		t.Fatalf("client-first %q, %v", first, err)
	}

	plain := Config{Brokers: []string{"b:9092"}}
	plain.Defaults()
	if sc, err := plain.sarama(); err != nil || sc.Net.TLS.Enable || sc.Net.SASL.Enable {
		t.Fatalf("PLAINTEXT turned on TLS or SASL: %v", err)
	}
}
