package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// columnTypesSQL reads a table's columns and their types as a query's row
// description gives them, and as the relay routes them: a domain, at any
// depth, as its base type.
const columnTypesSQL = `WITH RECURSIVE d(name, num, oid) AS (
		SELECT a.attname::text, a.attnum, a.atttypid FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT d.name, d.num, t.typbasetype FROM d JOIN pg_type t ON t.oid = d.oid AND t.typtype = 'd')
	SELECT d.name, d.oid FROM d JOIN pg_type t ON t.oid = d.oid WHERE t.typtype <> 'd' ORDER BY d.num`

// checkConnectTypes reports the columns the router writes through a Kafka
// Connect converter whose types pgoutbox refuses there (their Connect value
// is not Debezium's): every row with a value in one is a poison row, which
// stops the relay under relay.poison.policy=fail.
func checkConnectTypes(ctx context.Context, conn *pgx.Conn, cfg fileConfig) []checkResult {
	c := cfg.Config // RouterSet may pick a run id: not on the caller's copy
	set, err := c.RouterSet()
	if err != nil {
		return nil // the configuration check has reported it
	}
	var out []checkResult
	var userTypes map[uint32]replication.UserType
	for _, table := range cfg.Postgres.QualifiedTables() {
		placed := set.For(table).ConnectColumns()
		if len(placed) == 0 {
			continue
		}
		unread := func(err error) {
			out = append(out, warn("types", fmt.Sprintf("%s: column types not read: %s", table, oneLine(err)), ""))
		}
		var names []string
		var types []uint32
		// The name quoted as it is configured (to_regclass folds what is
		// not quoted to lower case).
		schema, name, _ := strings.Cut(table, ".")
		rows, _ := conn.Query(ctx, columnTypesSQL, pgx.Identifier{schema, name}.Sanitize())
		var n string
		var oid uint32
		if _, err := pgx.ForEachRow(rows, []any{&n, &oid}, func() error {
			names, types = append(names, n), append(types, oid)
			return nil
		}); err != nil {
			unread(err)
			continue
		}
		if len(names) == 0 {
			continue // a missing table is the tables check's
		}
		var err error
		if userTypes, err = replication.ReadUserTypes(ctx, conn, types, userTypes); err != nil {
			unread(err)
			continue
		}
		rt, _, _ := replication.RouterTypes(userTypes, types, nil)
		if rt == nil {
			rt = types
		}
		refused := 0
		for _, p := range placed {
			for i, n := range names {
				if n != p.Column {
					continue
				}
				why := router.ConnectTypeRefused(rt[i])
				if why == nil {
					continue
				}
				refused++
				detail := fmt.Sprintf("%s: column %s goes into %s, but its type is refused there: %v; every row with a value in it is a poison row", table, n, p.Where, why)
				fix := "place the column raw (key.converter, value.converter or header.converter left at pgoutbox's raw), cast it to text in the table, or stop placing it"
				if cfg.Relay.PoisonPolicy == "fail" {
					out = append(out, fail("types", detail+", and relay.poison.policy=fail stops the relay on the first", fix))
				} else {
					out = append(out, warn("types", detail+", dead-lettered", fix))
				}
			}
		}
		if refused == 0 {
			out = append(out, pass("types", fmt.Sprintf("%s: every column written through a Kafka Connect converter has a type pgoutbox writes as Debezium does", table)))
		}
	}
	return out
}
