package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestSecurityOptionsFromFileAndEnvironment: the kafka section's security
// options (inline in kafka.Config) and postgres.password(.file) are read
// from the file and from PGOUTBOX_<SECTION>_<KEY>, the environment winning.
func TestSecurityOptionsFromFileAndEnvironment(t *testing.T) {
	path := writeFile(t, `
postgres:
  dsn: postgres://app@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/etc/ca.pem
  password.file: /run/secrets/pg
kafka:
  brokers: [127.0.0.1:9093]
  security.protocol: SASL_SSL
  sasl.mechanism: SCRAM-SHA-512
  sasl.username: app
  ssl.ca.location: /etc/ca.pem
`)
	env := []string{
		"PGOUTBOX_KAFKA_SASL_PASSWORD=from-env",
		"PGOUTBOX_KAFKA_SASL_USERNAME=app2",
		"PGOUTBOX_POSTGRES_PASSWORD_FILE=/run/secrets/pg2",
		"PGOUTBOX_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM=none",
	}
	c := newFlags("run", &bytes.Buffer{}, "")
	cfg, err := c.load([]string{"--config", path}, env)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Kafka
	for _, c := range []struct{ name, got, want string }{
		{"security.protocol", k.Protocol, "SASL_SSL"},
		{"sasl.mechanism", k.SASLMechanism, "SCRAM-SHA-512"},
		{"sasl.username from env", k.SASLUsername, "app2"},
		{"sasl.password from env", k.SASLPassword, "from-env"},
		{"ssl.ca.location", k.SSLCALocation, "/etc/ca.pem"},
		{"ssl.endpoint.identification.algorithm from env", k.SSLEndpointIdentification, "none"},
		{"postgres.password.file from env", cfg.Postgres.PasswordFile, "/run/secrets/pg2"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	help := describeSettings()
	for _, want := range []string{"PGOUTBOX_KAFKA_SASL_PASSWORD_FILE", "PGOUTBOX_KAFKA_SECURITY_PROTOCOL", "PGOUTBOX_POSTGRES_PASSWORD_FILE"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not list %s", want)
		}
	}
}

// TestPasswordsFromTheConfigAreScrubbed: the second line of defence knows
// every configured password, including the contents of password files.
func TestPasswordsFromTheConfigAreScrubbed(t *testing.T) {
	pgFile := writeFile(t, "pg-file-secret\n")
	cfg := defaultFileConfig()
	cfg.Postgres.PasswordFile = pgFile
	cfg.Kafka.SASLPassword = "kafka-inline-secret"
	var b bytes.Buffer
	w := scrubSecrets(&b, "postgres://u@h/db", configSecrets(cfg)...)
	_, _ = w.Write([]byte("a pg-file-secret b kafka-inline-secret c\n"))
	if got := b.String(); got != "a xxxxx b xxxxx c\n" {
		t.Fatalf("scrubbed to %q", got)
	}
}
