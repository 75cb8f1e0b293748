package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// failingExec answers every statement with err.
type failingExec struct{ err error }

func (f failingExec) exec(context.Context, string, []any) (int64, error) { return 0, f.err }
func (f failingExec) queryRow(context.Context, string, ...any) error     { return f.err }

type serverError struct{}

func (serverError) Error() string    { return "ERROR: pgoutbox: an outbox call failed (SQLSTATE PGOB1)" }
func (serverError) SQLState() string { return SQLStateWriteFailed }

// TestFailTxSaysWhenTheTransactionMayStillCommit: the statement that makes
// the transaction fail can itself fail without reaching the server (the
// connection busy with an open result set, broken); the transaction may
// then still commit, without the event. The error says so instead of
// claiming what the documentation promises.
func TestFailTxSaysWhenTheTransactionMayStillCommit(t *testing.T) {
	cause := errors.New("outbox: event 0: aggregate id is empty")
	for _, c := range []struct {
		name string
		err  error
		told bool
	}{
		{"raised", serverError{}, false},
		{"ran", nil, false},
		{"conn busy", errors.New("conn busy"), true},
	} {
		got := failTx(context.Background(), failingExec{c.err}, cause)
		if !errors.Is(got, cause) {
			t.Errorf("%s: %v does not wrap the cause", c.name, got)
		}
		if told := strings.Contains(fmtErr(got), "could not be made to fail"); told != c.told {
			t.Errorf("%s: %v; want it to say the transaction may still commit: %v", c.name, got, c.told)
		}
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
