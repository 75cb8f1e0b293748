package replication

import (
	"errors"
	"strings"
	"testing"
)

// An invalid DSN is reported with what is wrong, never with its text: a
// password in it must not reach the log.
func TestInvalidDSNSaysWhatIsWrongWithoutQuotingIt(t *testing.T) {
	for _, dsn := range []string{
		"postgres://app:s3cr3t-pw@db.internal:port/shop",
		"host=db port=abc password=s3cr3t-pw",
		"postgres://app:s3cr3t-pw@db:99999/shop",
		"host=db password='s3cr3t-pw",
		"postgres://app:s3cr3t-pw@[::1/shop",
	} {
		c := DefaultConfig()
		c.DSN = dsn
		err := c.Validate()
		if !errors.Is(err, ErrInvalidDSN) {
			t.Errorf("%q: error %v, want ErrInvalidDSN", dsn, err)
			continue
		}
		msg := err.Error()
		for _, secret := range []string{"s3cr3t", "db.internal", "99999"} {
			if strings.Contains(msg, secret) {
				t.Errorf("%q: error %q quotes %q from the DSN", dsn, msg, secret)
			}
		}
		if strings.HasSuffix(msg, "may hold a password)") {
			t.Errorf("%q: error %q does not say what is wrong", dsn, msg)
		}
		t.Logf("%q → %v", dsn, err)
	}
}
