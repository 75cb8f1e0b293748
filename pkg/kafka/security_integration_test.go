package kafka

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// saslConfig is a Config for the environment's SASL_SSL listener.
func saslConfig(sec *testenv.Security, mechanism, user, password string) Config {
	return Config{
		Brokers: sec.KafkaSASLSSL,
		Security: Security{
			Protocol: ProtocolSASLSSL, SASLMechanism: mechanism,
			SASLUsername: user, SASLPassword: password,
			SSLCALocation: sec.CAFile,
		},
	}
}

// TestSASLSSLProducesWithEveryMechanism produces over TLS with each SASL
// mechanism, and with the password from a file, and reads the records back
// (through the PLAINTEXT listener, so the check does not depend on the
// code under test). The producer, Ping, CheckTopics and CreateTopics
// all go through the same configuration.
func TestSASLSSLProducesWithEveryMechanism(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	for _, mech := range []string{MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512} {
		t.Run(mech, func(t *testing.T) {
			topic := testenv.UniqueName(t, "kafka-sasl")
			cfg := saslConfig(sec, mech, sec.SASLUser, "")
			// The password from a file with a trailing newline, as echo
			// writes it.
			cfg.SASLPasswordFile = filepath.Join(t.TempDir(), "password")
			if err := os.WriteFile(cfg.SASLPasswordFile, []byte(sec.SASLPassword+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			env.CreateTopic(t, topic, 2)
			// Existing topics are left alone, but the admin client still
			// has to connect and read the metadata.
			if err := CreateTopics(cfg, []string{topic}, 2, 1); err != nil {
				t.Fatalf("CreateTopics over SASL_SSL: %v", err)
			}
			if err := Ping(context.Background(), cfg); err != nil {
				t.Fatalf("Ping: %v", err)
			}
			st, err := CheckTopics(context.Background(), cfg, []string{topic})
			if err != nil || st[0].Err != nil || st[0].Partitions != 2 {
				t.Fatalf("CheckTopics: %+v, %v", st, err)
			}
			p := newTestProducer(t, cfg)
			const n = 20
			rec := &router.Record{}
			for i := range n {
				*rec = router.Record{Topic: topic, Key: []byte{byte('a' + i%3)}, Value: []byte(mech + "-" + string(rune('A'+i))),
					Partition: -1, Timestamp: time.Now()}
				p.Send(rec, Meta{Ref: uint64(i)})
			}
			for _, a := range waitAcks(t, p, n, time.Minute) {
				if a.Err != nil {
					t.Fatalf("ack %d: %v", a.Ref, a.Err)
				}
			}
			msgs := env.NewConsumer(t, []string{topic}).WaitFor(t, n, time.Minute)
			for _, m := range msgs {
				if !strings.HasPrefix(string(m.Value), mech+"-") {
					t.Fatalf("unexpected record %q", m.Value)
				}
			}
		})
	}
}

// TestSASLWrongPasswordSaysWhatToCheck: a rejected password fails New and
// Ping at once with an *AuthError naming the broker, the mechanism and the
// options to check, and never the password.
func TestSASLWrongPasswordSaysWhatToCheck(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	const wrong = "not-the-password-4711"
	for _, mech := range []string{MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512} {
		t.Run(mech, func(t *testing.T) {
			cfg := saslConfig(sec, mech, sec.SASLUser, wrong)
			start := time.Now()
			_, err := New(context.Background(), cfg, nil)
			var ae *AuthError
			if !errors.As(err, &ae) {
				t.Fatalf("New: want an *AuthError, got %v", err)
			}
			if time.Since(start) > 20*time.Second {
				t.Errorf("New took %s to report bad credentials", time.Since(start))
			}
			msg := err.Error()
			for _, want := range []string{sec.KafkaSASLSSL[0], mech, "kafka.sasl.username", "kafka.sasl.password", sec.SASLUser} {
				if !strings.Contains(msg, want) {
					t.Errorf("error does not say %q: %s", want, msg)
				}
			}
			if strings.Contains(msg, wrong) {
				t.Fatalf("error quotes the password: %s", msg)
			}
			if err := Ping(context.Background(), cfg); !errors.As(err, &ae) || strings.Contains(err.Error(), wrong) {
				t.Fatalf("Ping: want an *AuthError without the password, got %v", err)
			}
			if _, err := CheckTopics(context.Background(), cfg, []string{"x"}); !errors.As(err, &ae) {
				t.Fatalf("CheckTopics: want an *AuthError, got %v", err)
			}
		})
	}
}

// TestTLSChecksTheBrokersCertificate: without the environment's CA the
// handshake fails, also with ssl.endpoint.identification.algorithm=none
// (which skips the name check only, not the chain's); with the CA it
// passes, with or without a client certificate.
func TestTLSChecksTheBrokersCertificate(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	cfg := saslConfig(sec, MechanismSCRAMSHA256, sec.SASLUser, sec.SASLPassword)
	cfg.SSLCALocation = "" // the system's CAs, which do not know ours
	cfg.DialTimeout = 5 * time.Second
	err := Ping(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Ping without the CA: want a certificate error, got %v", err)
	}
	cfg.SSLEndpointIdentification = EndpointIdentificationNone
	if err := Ping(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Ping without the CA, name check off: want a certificate error, got %v", err)
	}
	cfg.SSLCALocation = sec.CAFile
	if err := Ping(context.Background(), cfg); err != nil {
		t.Fatalf("Ping with the CA, name check off: %v", err)
	}
	// A client certificate is accepted (the broker does not ask for one,
	// but loading it must work).
	cfg.SSLCertificateLocation, cfg.SSLKeyLocation = sec.ClientCertFile, sec.ClientKeyFile
	if err := Ping(context.Background(), cfg); err != nil {
		t.Fatalf("Ping with a client certificate: %v", err)
	}
}

// TestLimitedUserGetsTopicAuthorizationFailed: a user without WRITE on a
// topic gets TOPIC_AUTHORIZATION_FAILED for its records, at once, and
// IsPoison says so; a topic it may write works.
func TestLimitedUserGetsTopicAuthorizationFailed(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	ok := testenv.UniqueName(t, "kafka-acl-ok")
	denied := testenv.UniqueName(t, "kafka-acl-denied")
	env.CreateTopic(t, ok, 1)
	env.CreateTopic(t, denied, 1)
	env.GrantTopic(t, sec.LimitedUser, ok, sarama.AclOperationWrite, sarama.AclOperationDescribe)
	env.GrantTopic(t, sec.LimitedUser, denied, sarama.AclOperationDescribe)

	p := newTestProducer(t, saslConfig(sec, MechanismSCRAMSHA512, sec.LimitedUser, sec.LimitedPassword))
	p.Send(&router.Record{Topic: ok, Value: []byte("v"), Partition: -1, Timestamp: time.Now()}, Meta{Ref: 0})
	if a := waitAcks(t, p, 1, time.Minute)[0]; a.Err != nil {
		t.Fatalf("record to the writable topic: %v", a.Err)
	}
	start := time.Now()
	p.Send(&router.Record{Topic: denied, Value: []byte("v"), Partition: -1, Timestamp: time.Now()}, Meta{Ref: 1})
	a := waitAcks(t, p, 1, time.Minute)[0]
	if !errors.Is(a.Err, sarama.ErrTopicAuthorizationFailed) || !IsPoison(a.Err) {
		t.Fatalf("record to the denied topic: want TOPIC_AUTHORIZATION_FAILED (poison), got %v", a.Err)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("the authorization failure took %s: it must not be retried", time.Since(start))
	}
}
