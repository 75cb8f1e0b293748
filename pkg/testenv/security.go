package testenv

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// Environment variables of the TLS and SASL part (scripts/testenv.sh).
const (
	envCA                 = "PGOUTBOX_TEST_CA"
	envKafkaSASLSSL       = "PGOUTBOX_TEST_KAFKA_SASL_SSL"
	envKafkaSASLUser      = "PGOUTBOX_TEST_KAFKA_SASL_USER"
	envKafkaSASLPassword  = "PGOUTBOX_TEST_KAFKA_SASL_PASSWORD"
	envKafkaLimitedUser   = "PGOUTBOX_TEST_KAFKA_LIMITED_USER"
	envKafkaLimitedPasswd = "PGOUTBOX_TEST_KAFKA_LIMITED_PASSWORD"
	envPGSSLUser          = "PGOUTBOX_TEST_PG_SSL_USER"
	envPGSSLPassword      = "PGOUTBOX_TEST_PG_SSL_PASSWORD"
	securityHowTo         = "the test environment has no TLS/SASL settings (PGOUTBOX_TEST_KAFKA_SASL_SSL and friends): make it anew with scripts/testenv.sh up"
	pgTLSHowTo            = "the test environment's PostgreSQL has no TLS (PGOUTBOX_TEST_PG_SSL_USER unset: its build lacks TLS support)"
)

// Security is the environment's TLS and SASL material: its own certificate
// authority (which signed both servers' certificates, for 127.0.0.1 and
// localhost), Kafka's SASL_SSL listener with its users, and PostgreSQL's
// TLS-only role. ACLs are on in Kafka: SASLUser (and the PLAINTEXT
// listener) may do anything, LimitedUser only what GrantTopic grants.
type Security struct {
	// CAFile is the CA certificate (PEM); ClientCertFile and ClientKeyFile
	// a client certificate it signed, and its key.
	CAFile, ClientCertFile, ClientKeyFile string
	// KafkaSASLSSL are the SASL_SSL listener's addresses (PLAIN,
	// SCRAM-SHA-256 and SCRAM-SHA-512 on).
	KafkaSASLSSL []string
	// SASLUser is a super user; LimitedUser is bound by ACLs.
	SASLUser, SASLPassword       string
	LimitedUser, LimitedPassword string
	// PGSSLUser may connect only over TLS, with PGSSLPassword
	// (scram-sha-256); it has LOGIN, REPLICATION and CREATEDB. Empty when
	// the server has no TLS: see RequirePGTLS.
	PGSSLUser, PGSSLPassword string
}

// Security returns the environment's TLS and SASL material, or skips the
// test when the environment has none (fails it under
// PGOUTBOX_REQUIRE_INTEGRATION=1).
func (e *Env) Security(t testing.TB) *Security {
	t.Helper()
	s := &Security{
		CAFile:          os.Getenv(envCA),
		SASLUser:        os.Getenv(envKafkaSASLUser),
		SASLPassword:    os.Getenv(envKafkaSASLPassword),
		LimitedUser:     os.Getenv(envKafkaLimitedUser),
		LimitedPassword: os.Getenv(envKafkaLimitedPasswd),
		PGSSLUser:       os.Getenv(envPGSSLUser),
		PGSSLPassword:   os.Getenv(envPGSSLPassword),
	}
	for _, b := range strings.Split(os.Getenv(envKafkaSASLSSL), ",") {
		if b = strings.TrimSpace(b); b != "" {
			s.KafkaSASLSSL = append(s.KafkaSASLSSL, b)
		}
	}
	if s.CAFile == "" || len(s.KafkaSASLSSL) == 0 || s.SASLPassword == "" || s.LimitedPassword == "" {
		if os.Getenv(envRequire) == "1" {
			t.Fatal(securityHowTo)
		}
		t.Skip(securityHowTo)
	}
	s.ClientCertFile = filepath.Join(filepath.Dir(s.CAFile), "client.pem")
	s.ClientKeyFile = filepath.Join(filepath.Dir(s.CAFile), "client.key")
	return s
}

// RequirePGTLS skips the test unless PostgreSQL runs with TLS and the
// TLS-only role exists. A server built without TLS is a legitimate
// environment, so this skips even under PGOUTBOX_REQUIRE_INTEGRATION=1.
func (s *Security) RequirePGTLS(t testing.TB) {
	t.Helper()
	if s.PGSSLUser == "" {
		t.Skip(pgTLSHowTo)
	}
}

// PGTLSDSN turns dsn (a postgres:// URL, such as NewDatabase's) into one
// for the same database as PGSSLUser over TLS with sslmode (require,
// verify-ca, verify-full) and the environment's CA. It holds no password.
func (s *Security) PGTLSDSN(t testing.TB, dsn, sslmode string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testenv: parse DSN: %v", err)
	}
	u.User = url.User(s.PGSSLUser)
	q := u.Query()
	q.Set("sslmode", sslmode)
	q.Set("sslrootcert", s.CAFile)
	u.RawQuery = q.Encode()
	return u.String()
}

// GrantTopic gives user the operations (sarama.AclOperationWrite,
// sarama.AclOperationDescribe, ...) on every topic whose name starts with
// prefix, through the PLAINTEXT listener (a super user), and removes the
// grant when the test ends.
func (e *Env) GrantTopic(t testing.TB, user, prefix string, ops ...sarama.AclOperation) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(e.KafkaBrokers, newSaramaConfig())
	if err != nil {
		t.Fatalf("testenv: connect to Kafka: %v", err)
	}
	defer func() { _ = admin.Close() }()
	res := sarama.Resource{ResourceType: sarama.AclResourceTopic, ResourceName: prefix, ResourcePatternType: sarama.AclPatternPrefixed}
	var acls []*sarama.ResourceAcls
	for _, op := range ops {
		acls = append(acls, &sarama.ResourceAcls{Resource: res, Acls: []*sarama.Acl{{
			Principal: "User:" + user, Host: "*", Operation: op, PermissionType: sarama.AclPermissionAllow,
		}}})
	}
	if err := admin.CreateACLs(acls); err != nil {
		t.Fatalf("testenv: grant %v on topics %s* to %s: %v", ops, prefix, user, err)
	}
	// The controller commits the ACLs before the broker's authorizer has
	// them: wait until the broker lists them all.
	principal, name := "User:"+user, prefix
	filter := sarama.AclFilter{
		ResourceType: sarama.AclResourceTopic, ResourceName: &name,
		ResourcePatternTypeFilter: sarama.AclPatternPrefixed, Principal: &principal,
		Operation: sarama.AclOperationAny, PermissionType: sarama.AclPermissionAny,
	}
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		rs, err := admin.ListAcls(filter)
		n := 0
		for _, r := range rs {
			n += len(r.Acls)
		}
		return err == nil && n >= len(ops), fmt.Sprintf("the broker lists %d of the %d ACLs granted on topics %s* to %s (%v)", n, len(ops), prefix, user, err)
	})
	t.Cleanup(func() {
		admin, err := sarama.NewClusterAdmin(e.KafkaBrokers, newSaramaConfig())
		if err != nil {
			t.Errorf("testenv: connect to Kafka: %v", err)
			return
		}
		defer func() { _ = admin.Close() }()
		principal := "User:" + user
		name := prefix
		filter := sarama.AclFilter{
			ResourceType: sarama.AclResourceTopic, ResourceName: &name,
			ResourcePatternTypeFilter: sarama.AclPatternPrefixed,
			Principal:                 &principal,
			Operation:                 sarama.AclOperationAny, PermissionType: sarama.AclPermissionAny,
		}
		if _, err := admin.DeleteACL(filter, false); err != nil {
			t.Errorf("testenv: remove the grants on topics %s*: %v", prefix, err)
		}
	})
}

// String names the listener and users, never the passwords.
func (s *Security) String() string {
	return fmt.Sprintf("SASL_SSL %v users %s, %s; PostgreSQL TLS role %q", s.KafkaSASLSSL, s.SASLUser, s.LimitedUser, s.PGSSLUser)
}
