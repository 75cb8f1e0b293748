package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SQLStateWriteFailed is the SQLSTATE of the error Write, WriteSQL, Process
// and ProcessSQL raise in their transaction when they fail without a
// database error (an invalid event, rows a trigger or rule kept out), so
// that the transaction cannot commit. The server logs it; the application
// sees the error the call returned, and then a failing Commit.
const SQLStateWriteFailed = "PGOB1"

// failTxTimeout bounds the statement that makes a transaction fail.
const failTxTimeout = 15 * time.Second

// failTx makes the transaction db fail on the server after a call that was
// given it failed with cause. Without it, a failure found before anything
// was sent (an invalid event) or found in a statement that succeeded (a
// BEFORE INSERT trigger that kept rows out) left the transaction healthy,
// and an application that committed anyway (the error overwritten, or only
// logged) kept its business change and lost the event, without a word.
// After a database error the transaction is aborted already and the
// statement fails at once with the server's error, as it does when it
// works. Any other failure of its own (the connection busy with an open
// result set, broken, or the statement's time up) may have left the
// transaction able to commit: the error returned then says so.
//
// The statement runs even when ctx is cancelled (a cancelled context is a
// common cause, and a Commit may still follow with another context).
func failTx(ctx context.Context, db execer, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failTxTimeout)
	defer cancel()
	_, err := db.exec(ctx, failTxStatement(cause), nil)
	// The server's error (pgx's, lib/pq's): the transaction is aborted.
	var server interface{ SQLState() string }
	if err == nil || errors.As(err, &server) {
		return cause
	}
	return fmt.Errorf("%w (and the transaction could not be made to fail, so a Commit may still succeed without the event: roll it back: %v)", cause, err)
}

// failTxStatement returns a DO block that raises an error naming cause. A DO
// block takes no parameters, so the reason is written into it, limited to
// characters that mean nothing to SQL, PL/pgSQL string literals or RAISE's
// format (no quotes, backslashes, dollar or percent signs).
func failTxStatement(cause error) string {
	reason := sanitizeReason(cause.Error(), 300)
	return `DO $pgoutbox$BEGIN RAISE EXCEPTION USING ERRCODE = '` + SQLStateWriteFailed +
		`', MESSAGE = 'pgoutbox: an outbox call failed in this transaction, which therefore must not commit (` + reason + `)', ` +
		`HINT = 'roll the transaction back; the error the call returned to the application says what failed'; END$pgoutbox$`
}

// sanitizeReason keeps the printable ASCII of s that is safe inside a
// single-quoted literal in a dollar-quoted body, replacing the rest with
// '?', and cuts it to at most max bytes.
func sanitizeReason(s string, max int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < max; i++ {
		c := s[i]
		switch {
		case c == '\'' || c == '\\' || c == '$' || c == '%':
			b.WriteByte('?')
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		case c >= 0x80 && (i == 0 || s[i-1] < 0x80):
			b.WriteByte('?') // one ? per run of non-ASCII bytes
		case c < 0x80:
			b.WriteByte(' ')
		}
	}
	return b.String()
}
