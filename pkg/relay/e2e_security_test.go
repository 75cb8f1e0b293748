package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// writeSecret writes password to a file of the test's, with a trailing
// newline as echo or an editor leaves it, and returns the file's path.
func writeSecret(t testing.TB, password string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// useTLSRole hands the fixture's database and outbox table to the
// environment's TLS-only role, so that a relay connecting as that role may
// create the publication and the slot, and returns the DSN for it
// (sslmode=verify-full with the environment's CA, no password).
func (f *fixture) useTLSRole(t testing.TB, sec *testenv.Security) string {
	t.Helper()
	ctx := context.Background()
	var db string
	if err := f.conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		fmt.Sprintf(`ALTER DATABASE %q OWNER TO %q`, db, sec.PGSSLUser),
		fmt.Sprintf(`ALTER TABLE outbox OWNER TO %q`, sec.PGSSLUser),
	} {
		if _, err := f.conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return sec.PGTLSDSN(t, f.dsn, "verify-full")
}

// kafkaSASL points cfg's Kafka section at the SASL_SSL listener.
func kafkaSASL(cfg *relay.Config, sec *testenv.Security, mechanism, user string) {
	cfg.Kafka.Brokers = sec.KafkaSASLSSL
	cfg.Kafka.Security = kafka.Security{Protocol: kafka.ProtocolSASLSSL, SASLMechanism: mechanism, SASLUsername: user, SSLCALocation: sec.CAFile}
}

// startRelay starts r.Run on its own goroutine; the returned channel gets its
// result. The test's cleanup stops it and waits.
func startRelay(t *testing.T, r *relay.Relay) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		done <- r.Run(ctx)
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(time.Minute):
			t.Error("relay did not stop within a minute")
		}
	})
	return done
}

// TestRelayDeliversOverSASLSSLWithEachMechanism runs the relay against
// Kafka's SASL_SSL listener with each mechanism (the password from a file)
// and, where the server has TLS, against PostgreSQL as a role pg_hba.conf
// admits over TLS only, with sslmode=verify-full and its password from a
// file too; the events written arrive.
func TestRelayDeliversOverSASLSSLWithEachMechanism(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	for _, mech := range []string{kafka.MechanismPlain, kafka.MechanismSCRAMSHA256, kafka.MechanismSCRAMSHA512} {
		t.Run(mech, func(t *testing.T) {
			f := newFixture(t, env, 2)
			cfg := f.config()
			if sec.PGSSLUser != "" {
				cfg.Postgres.DSN = f.useTLSRole(t, sec)
				cfg.Postgres.PasswordFile = writeSecret(t, sec.PGSSLPassword)
			} else {
				t.Log("PostgreSQL has no TLS here: the relay reads it without")
			}
			kafkaSASL(&cfg, sec, mech, sec.SASLUser)
			cfg.Kafka.SASLPasswordFile = writeSecret(t, sec.SASLPassword)
			r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			if err != nil {
				t.Fatal(err)
			}
			done := startRelay(t, r)
			f.waitStreaming(t)
			if sec.PGSSLUser != "" {
				// The walsender is the TLS role's, over TLS.
				var ssl bool
				err := f.checkDB.QueryRow(context.Background(), `SELECT s.ssl FROM pg_stat_ssl s
					JOIN pg_stat_activity a USING (pid)
					JOIN pg_replication_slots r ON r.active_pid = a.pid
					WHERE r.slot_name = $1 AND a.usename = $2`, f.slot, sec.PGSSLUser).Scan(&ssl)
				if err != nil || !ssl {
					t.Fatalf("the replication connection is not %s over TLS: ssl=%v, %v", sec.PGSSLUser, ssl, err)
				}
			}
			const n = 10
			for i := range n {
				_, err := f.conn.Exec(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
					VALUES (gen_random_uuid(), $1, $2, 'T', json_build_object('n', $3::int))`, f.shape.AggregateTypes[0], fmt.Sprint(i%3), i)
				if err != nil {
					t.Fatal(err)
				}
			}
			msgs := env.NewConsumer(t, []string{f.topics[0]}).WaitFor(t, n, time.Minute)
			if len(msgs) != n {
				t.Fatalf("%d records, want %d", len(msgs), n)
			}
			select {
			case err := <-done:
				t.Fatalf("relay stopped: %v", err)
			default:
			}
		})
	}
}

// TestRelayStartupSaysWhichPasswordIsWrong: a wrong Kafka password and a
// wrong PostgreSQL password each stop the relay at start-up with an error
// that names the server and what to check, and never the password.
func TestRelayStartupSaysWhichPasswordIsWrong(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	const wrong = "wrong-password-31337"
	t.Run("kafka", func(t *testing.T) {
		f := newFixture(t, env, 1)
		cfg := f.config()
		kafkaSASL(&cfg, sec, kafka.MechanismSCRAMSHA256, sec.SASLUser)
		cfg.Kafka.SASLPassword = wrong
		err := runUntilStartupError(t, cfg)
		var ae *kafka.AuthError
		if !errors.As(err, &ae) {
			t.Fatalf("want a *kafka.AuthError, got %v", err)
		}
		for _, want := range []string{sec.KafkaSASLSSL[0], "SCRAM-SHA-256", "kafka.sasl.username", "kafka.sasl.password"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not say %q: %v", want, err)
			}
		}
		if strings.Contains(err.Error(), wrong) {
			t.Fatalf("error quotes the password: %v", err)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		sec.RequirePGTLS(t)
		f := newFixture(t, env, 1)
		cfg := f.config()
		cfg.Postgres.DSN = f.useTLSRole(t, sec)
		cfg.Postgres.PasswordFile = writeSecret(t, wrong)
		err := runUntilStartupError(t, cfg)
		for _, want := range []string{"password authentication failed", sec.PGSSLUser, "postgres.password"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not say %q: %v", want, err)
			}
		}
		if strings.Contains(err.Error(), wrong) {
			t.Fatalf("error quotes the password: %v", err)
		}
	})
	t.Run("postgres password file missing", func(t *testing.T) {
		f := newFixture(t, env, 1)
		cfg := f.config()
		cfg.Postgres.PasswordFile = filepath.Join(t.TempDir(), "no-such-file")
		err := runUntilStartupError(t, cfg)
		if !strings.Contains(err.Error(), "postgres: password.file") || !strings.Contains(err.Error(), cfg.Postgres.PasswordFile) {
			t.Fatalf("error does not name the option and the file: %v", err)
		}
	})
}

// runUntilStartupError runs a relay with cfg and returns its
// *relay.StartupError, failing the test if it returns anything else.
func runUntilStartupError(t *testing.T, cfg relay.Config) error {
	t.Helper()
	r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-startRelay(t, r):
	case <-time.After(time.Minute):
		t.Fatal("the relay did not stop within a minute")
	}
	var se *relay.StartupError
	if !errors.As(err, &se) {
		t.Fatalf("want a *relay.StartupError, got %v", err)
	}
	t.Logf("start-up error: %v", err)
	return err
}

// TestPoisonTopicNotWritableFollowsThePolicy: with ACLs, a user that may
// describe a topic but not write it gets TOPIC_AUTHORIZATION_FAILED for
// its records; the relay treats that as poison: with fail it stops naming
// the event, the LSN and the reason; with dead-letter the record goes to
// the dead-letter topic (which the user may write) and later events flow.
func TestPoisonTopicNotWritableFollowsThePolicy(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	const good1, bad, good2 = "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000b2", "00000000-0000-4000-8000-0000000000c3"
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			f := newFixture(t, env, 1)
			ctx := context.Background()
			okType, deniedType := f.slot+"_ok", f.slot+"_denied"
			okTopic, deniedTopic, dlq := "outbox.event."+okType, "outbox.event."+deniedType, f.slot+".dlq"
			for _, topic := range []string{okTopic, deniedTopic, dlq} {
				env.CreateTopic(t, topic, 1)
			}
			env.GrantTopic(t, sec.LimitedUser, okTopic, sarama.AclOperationWrite, sarama.AclOperationDescribe)
			env.GrantTopic(t, sec.LimitedUser, dlq, sarama.AclOperationWrite, sarama.AclOperationDescribe)
			env.GrantTopic(t, sec.LimitedUser, deniedTopic, sarama.AclOperationDescribe)

			cfg := f.config()
			kafkaSASL(&cfg, sec, kafka.MechanismSCRAMSHA512, sec.LimitedUser)
			cfg.Kafka.SASLPassword = sec.LimitedPassword
			cfg.Relay.PoisonPolicy = policy
			cfg.Relay.DeadLetterTopic = dlq
			r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
			if err != nil {
				t.Fatal(err)
			}
			done := startRelay(t, r)
			f.waitStreaming(t)
			insert := func(id, aggType string) {
				t.Helper()
				_, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`, id, aggType)
				if err != nil {
					t.Fatal(err)
				}
			}
			insert(good1, okType)
			c := env.NewConsumer(t, []string{okTopic})
			c.WaitFor(t, 1, time.Minute)
			insert(bad, deniedType)
			insert(good2, okType)

			if policy == "fail" {
				var err error
				select {
				case err = <-done:
				case <-time.After(time.Minute):
					t.Fatal("relay did not stop on the record it may not write")
				}
				var fe *relay.FatalError
				if !errors.As(err, &fe) || !errors.Is(err, sarama.ErrTopicAuthorizationFailed) {
					t.Fatalf("want a fatal TOPIC_AUTHORIZATION_FAILED, got %v", err)
				}
				for _, want := range []string{bad, deniedTopic, "0/", "poison.policy=fail"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not say %q: %v", want, err)
					}
				}
				return
			}
			msgs := c.WaitFor(t, 2, time.Minute)
			if id, _ := msgs[1].Header("id"); string(id) != good2 {
				t.Fatalf("second record is %s, want %s", id, good2)
			}
			d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, time.Minute)[0]
			id, _ := d.Header("id")
			reason, _ := d.Header("pgoutbox.error.reason")
			if string(id) != bad || !strings.Contains(strings.ToLower(string(reason)), "authoriz") {
				t.Fatalf("dead-letter record: id %q reason %q", id, reason)
			}
			select {
			case err := <-done:
				t.Fatalf("relay stopped: %v", err)
			default:
			}
		})
	}
}

// runToEnd runs the pgoutbox binary with args and environ until it exits
// (at most two minutes) and returns its exit code and its whole output.
func runToEnd(t *testing.T, args, environ []string) (int, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), strings.Join(args, "-")+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, pgoutboxBinary(t), args, environ, lf, logPath)
	code := p.wait(t, 2*time.Minute)
	out, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// TestBinaryNeverPrintsAPassword runs the pgoutbox binary (run, validate,
// status) at debug level with passwords in the environment and in files,
// right and wrong, and checks that no password appears anywhere in its
// output, not even masked: the scrubbing writer is a second line of
// defence, and this checks the first (nothing prints one).
func TestBinaryNeverPrintsAPassword(t *testing.T) {
	env := testenv.Require(t)
	sec := env.Security(t)
	f := newFixture(t, env, 1)
	const wrongKafka, wrongPG = "wrong-kafka-pw-2718", "wrong-pg-pw-1618"
	secrets := []string{sec.SASLPassword, sec.PGSSLPassword, wrongKafka, wrongPG}
	base := append(f.environ(),
		"PGOUTBOX_LOG_LEVEL=debug",
		"PGOUTBOX_KAFKA_BROKERS="+strings.Join(sec.KafkaSASLSSL, ","),
		"PGOUTBOX_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
		"PGOUTBOX_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
		"PGOUTBOX_KAFKA_SASL_USERNAME="+sec.SASLUser,
		"PGOUTBOX_KAFKA_SSL_CA_LOCATION="+sec.CAFile,
	)
	// with copies: appending to a shared slice would let the variants
	// overwrite each other.
	with := func(a []string, extra ...string) []string { return append(slices.Clone(a), extra...) }
	pgRight, pgWrong := base, base
	if sec.PGSSLUser != "" {
		dsn := f.useTLSRole(t, sec)
		pgRight = with(base, "PGOUTBOX_POSTGRES_DSN="+dsn, "PGOUTBOX_POSTGRES_PASSWORD_FILE="+writeSecret(t, sec.PGSSLPassword))
		pgWrong = with(base, "PGOUTBOX_POSTGRES_DSN="+dsn, "PGOUTBOX_POSTGRES_PASSWORD_FILE="+writeSecret(t, wrongPG))
	} else {
		t.Log("PostgreSQL has no TLS here: only Kafka passwords are checked")
	}
	kafkaRight := "PGOUTBOX_KAFKA_SASL_PASSWORD=" + sec.SASLPassword
	kafkaWrong := "PGOUTBOX_KAFKA_SASL_PASSWORD=" + wrongKafka
	kafkaWrongFile := "PGOUTBOX_KAFKA_SASL_PASSWORD_FILE=" + writeSecret(t, wrongKafka)
	topics := "--topics=" + f.topics[0]

	var outputs []string
	check := func(what string, code int, out string, wantCode int, wants ...string) {
		t.Helper()
		outputs = append(outputs, out)
		t.Logf("%s: exit code %d, %d bytes of output", what, code, len(out))
		if wantCode >= 0 && code != wantCode {
			t.Errorf("%s: exit code %d, want %d; output:\n%s", what, code, wantCode, out)
		}
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output does not say %q:\n%s", what, w, out)
			}
		}
	}

	// A good run: it delivers an event and stops cleanly.
	logPath := filepath.Join(t.TempDir(), "run.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, pgoutboxBinary(t), []string{"run"}, with(pgRight, kafkaRight), lf, logPath)
	f.waitStreaming(t)
	if _, err := f.conn.Exec(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), $1, 'k', 'T', '{}')`, f.shape.AggregateTypes[0]); err != nil {
		t.Fatal(err)
	}
	env.NewConsumer(t, []string{f.topics[0]}).WaitFor(t, 1, time.Minute)
	p.terminate(t, time.Minute)
	out, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	check("run", 0, string(out), 0, "kafka producer started")

	code, o := runToEnd(t, []string{"validate", topics}, with(pgRight, kafkaRight))
	check("validate", code, o, -1, "reachable at "+sec.KafkaSASLSSL[0])
	code, o = runToEnd(t, []string{"status"}, with(pgRight, kafkaRight))
	check("status", code, o, 0)

	// Wrong Kafka passwords, from the environment and from a file.
	code, o = runToEnd(t, []string{"run"}, with(pgRight, kafkaWrong))
	check("run, wrong Kafka password", code, o, 3, "kafka.sasl.password", "SCRAM-SHA-512")
	code, o = runToEnd(t, []string{"run"}, with(pgRight, kafkaWrongFile))
	check("run, wrong Kafka password file", code, o, 3, "kafka.sasl.password")
	code, o = runToEnd(t, []string{"validate", topics}, with(pgRight, kafkaWrong))
	check("validate, wrong Kafka password", code, o, -1, "kafka.sasl.password")

	if sec.PGSSLUser != "" {
		code, o = runToEnd(t, []string{"run"}, with(pgWrong, kafkaRight))
		check("run, wrong PostgreSQL password", code, o, 3, "password authentication failed")
		code, o = runToEnd(t, []string{"validate", topics}, with(pgWrong, kafkaRight))
		check("validate, wrong PostgreSQL password", code, o, -1, "password authentication failed")
		code, o = runToEnd(t, []string{"status"}, with(pgWrong, kafkaRight))
		check("status, wrong PostgreSQL password", code, o, 3, "password authentication failed")
	}

	for i, out := range outputs {
		for _, s := range secrets {
			if s != "" && strings.Contains(out, s) {
				t.Errorf("output %d shows a password:\n%s", i, out)
			}
		}
		if strings.Contains(out, "xxxxx") {
			t.Errorf("output %d needed scrubbing (something printed a password):\n%s", i, out)
		}
	}
}
