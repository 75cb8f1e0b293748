package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/replication"
)

// unseenUpdates says, when router.table.op.invalid.behavior is error or
// fatal, that it has no effect with a publication that does not publish
// updates (pgoutbox's own publishes inserts only): an UPDATE of an outbox
// row is then not decoded at all, so it is neither logged, nor counted,
// nor does it stop the relay. pubExists false means the publication does
// not exist yet and pgoutbox will create it (inserts only).
func unseenUpdates(cfg fileConfig, pubExists, pubUpdate bool) (string, bool) {
	behavior := strings.ToLower(strings.TrimSpace(cfg.Router.OpInvalidBehavior))
	if behavior == "" || behavior == "warn" || (pubExists && pubUpdate) {
		return "", false
	}
	pub := fmt.Sprintf("publication %q does not publish updates", cfg.Postgres.Publication)
	if !pubExists {
		pub = fmt.Sprintf("publication %q, which pgoutbox creates, will publish inserts only", cfg.Postgres.Publication)
	}
	return fmt.Sprintf("router.table.op.invalid.behavior is %s, but %s: an UPDATE of an outbox row is not seen at all (not decoded, so neither logged, counted, nor stopping the relay as %s would); the option has no effect",
		behavior, pub, behavior), true
}

// unseenUpdatesFix is what to do about unseenUpdates.
func unseenUpdatesFix(cfg fileConfig) string {
	return fmt.Sprintf("if updates of outbox rows must be noticed, publish them (ALTER PUBLICATION %s SET (publish = 'insert, update');), or set router.table.op.invalid.behavior=warn to say what happens",
		pgx.Identifier{cfg.Postgres.Publication}.Sanitize())
}

// checkUnseenUpdates is validate's WARN of unseenUpdates.
func checkUnseenUpdates(ctx context.Context, conn *pgx.Conn, cfg fileConfig) (checkResult, bool) {
	ctx, cancel := context.WithTimeout(ctx, statusQueryTimeout)
	defer cancel()
	p, err := replication.ReadPublication(ctx, conn, cfg.Postgres.Publication)
	if err != nil {
		return checkResult{}, false
	}
	if d, ok := unseenUpdates(cfg, p.Exists, p.Update); ok {
		return warn("router.table.op.invalid.behavior", d, unseenUpdatesFix(cfg)), true
	}
	return checkResult{}, false
}

// warnUnseenUpdates logs unseenUpdates as pgoutbox run starts. It asks the
// server on a connection of its own; a failure is left to the relay's
// start, which reports it.
func warnUnseenUpdates(ctx context.Context, cfg fileConfig, log *zap.Logger) {
	if isPoll(cfg) {
		return
	}
	if _, ok := unseenUpdates(cfg, false, false); !ok {
		return // warn: nothing to say whatever the publication
	}
	rc := cfg.Postgres
	ctx, cancel := context.WithTimeout(ctx, rc.ConnectTimeout+statusQueryTimeout)
	defer cancel()
	conn, err := replication.ConnectSQL(ctx, rc, "pgoutbox-check", rc.ConnectTimeout)
	if err != nil {
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	p, err := replication.ReadPublication(ctx, conn, rc.Publication)
	if err != nil {
		return
	}
	if d, ok := unseenUpdates(cfg, p.Exists, p.Update); ok {
		log.Warn(d, zap.String("publication", rc.Publication), zap.String("fix", unseenUpdatesFix(cfg)))
	}
}
