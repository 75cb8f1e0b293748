package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

// validateStart runs the checks pgoutbox run makes at start against the
// state table (postgres.state.table), reading only: the role's privileges
// on it, the publication carrying it, and the slot's recorded history
// (replication.CheckStart, then relay.StartRefusal: the same judgements as
// replication.Prepare and the relay's first session).
func validateStart(ctx context.Context, v *validation, conn *pgx.Conn, f pgFacts, cfg fileConfig) {
	rc := cfg.Postgres
	if rc.StateTable == "" || replication.ValidateSlotName(rc.Slot) != nil || replication.ValidatePublicationName(rc.Publication) != nil {
		return // no history kept (a WARN above), or a name the config check refused
	}
	ctx, cancel := context.WithTimeout(ctx, statusQueryTimeout)
	defer cancel()
	name := "state table " + rc.StateTable
	missing, exists, err := replication.StateTablePrivileges(ctx, conn, rc.StateTable)
	if err != nil {
		v.report(fail(name, "reading the role's privileges on it failed: "+oneLine(err), "run pgoutbox validate again"))
		return
	}
	if len(missing) > 0 {
		v.report(stateTablePrivilegeResult(rc.StateTable, f.user, missing, exists))
		return
	}
	if f.pub.Exists && !f.pub.AllTables && exists {
		published, oid, err := replication.StateTablePublished(ctx, conn, rc.Publication, rc.StateTable)
		switch {
		case err != nil:
			v.report(warn(name, "not checked whether publication "+rc.Publication+" carries it: "+oneLine(err), "run pgoutbox validate again"))
		case published:
			// A FOR TABLES IN SCHEMA publication of the state table's
			// schema: run decodes its own writes of the state row at
			// every start.
			v.report(fail(name, relay.NotOutboxTableProblem(rc.StateTable, oid, rc.Publication)+
				": pgoutbox run writes the slot's history there at every start and then stops on that write, so it never streams (a publication FOR TABLES IN SCHEMA carries every table of the schema)",
				fmt.Sprintf("keep the state table out of the publication: move it to a schema the publication does not carry (CREATE SCHEMA pgoutbox; ALTER TABLE %s SET SCHEMA pgoutbox; and set postgres.state.table to pgoutbox.<table>), or publish the outbox tables by name (ALTER PUBLICATION %s SET TABLE <outbox tables>)",
					rc.StateTable, pgx.Identifier{rc.Publication}.Sanitize())))
			return
		}
	}
	start, unknown, err := replication.CheckStart(ctx, conn, rc)
	for _, u := range unknown {
		v.report(warn("start", u+"; pgoutbox run holds pgoutbox cleanup until someone has looked", ""))
	}
	if err == nil {
		err = relay.StartRefusal(start, cfg.Config)
	}
	if err == nil {
		err = pollRowsLeft(ctx, conn, cfg)
	}
	if err != nil {
		v.report(fail("start", "pgoutbox run refuses to start: "+oneLine(err),
			"do what the message says (pgoutbox run exits with the same message)"))
		return
	}
	switch {
	case !start.HadState:
		v.report(pass("start", fmt.Sprintf("no history of slot %q recorded in %s yet: pgoutbox run records it at its first start", rc.Slot, rc.StateTable)))
	default:
		v.report(pass("start", fmt.Sprintf("the history of slot %q recorded in %s lets pgoutbox run start", rc.Slot, rc.StateTable)))
	}
}

// stateTablePrivilegeResult is the FAIL line of a role that lacks
// privileges pgoutbox run needs on the state table (or its schema).
func stateTablePrivilegeResult(table, user string, missing []string, exists bool) checkResult {
	role := pgx.Identifier{user}.Sanitize()
	name := "state table " + table
	if !exists {
		return fail(name, fmt.Sprintf("does not exist, and %q lacks %s, so pgoutbox run cannot create it: it stops at start (permission denied)", user, strings.Join(missing, " and ")),
			fmt.Sprintf("run pgoutbox migrate as the outbox tables' owner (it creates the table, then GRANT SELECT, INSERT, UPDATE ON %s TO %s;), or grant %s the privileges named", quoteTableName(table), role, role))
	}
	var onTable, onSchema []string
	for _, m := range missing {
		if strings.HasPrefix(m, "USAGE on schema") {
			onSchema = append(onSchema, m)
		} else {
			onTable = append(onTable, m)
		}
	}
	what := strings.Join(append(onSchema, onTable...), ", ")
	fix := ""
	if len(onSchema) > 0 {
		schema, _, _ := strings.Cut(table, ".")
		fix = fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s; ", pgx.Identifier{schema}.Sanitize(), role)
	}
	if len(onTable) > 0 {
		fix += fmt.Sprintf("GRANT %s ON %s TO %s;", strings.Join(onTable, ", "), quoteTableName(table), role)
	}
	return fail(name, fmt.Sprintf("%q lacks %s on it: pgoutbox run reads the slot's history there at start, writes it at the first start and updates it at every session, and stops at start without them (permission denied for table)", user, what),
		"as the table's owner: "+strings.TrimSpace(fix))
}

// quoteTableName quotes schema.table.
func quoteTableName(table string) string {
	schema, name, ok := strings.Cut(table, ".")
	if !ok {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}
