package deploy

import (
	"strings"
	"testing"
)

// TestChartRefusesValuesThatWouldNotWork renders the golden values with
// one thing wrong and expects both Helm libraries to refuse them with a
// message that names it: a password outside a Secret, a key the chart
// owns, an ambiguous or missing database, a values key that does not
// exist.
func TestChartRefusesValuesThatWouldNotWork(t *testing.T) {
	section := func(v map[string]any, key string) map[string]any {
		cfg := v["config"].(map[string]any)
		if cfg[key] == nil {
			cfg[key] = map[string]any{}
		}
		return cfg[key].(map[string]any)
	}
	orders := func(v map[string]any) map[string]any { return v["streams"].([]any)[0].(map[string]any) }
	payments := func(v map[string]any) map[string]any { return v["streams"].([]any)[1].(map[string]any) }
	pg := func(s map[string]any) map[string]any { return s["postgres"].(map[string]any) }
	connectorConfig := func(s map[string]any) map[string]any {
		return s["connector"].(map[string]any)["json"].(map[string]any)["config"].(map[string]any)
	}
	for _, tc := range []struct {
		name   string
		change func(v map[string]any)
		want   string
	}{
		{"postgres.password in config", func(v map[string]any) { section(v, "postgres")["password"] = "pw" }, "postgres.password is not accepted"},
		{"postgres.password.file in config", func(v map[string]any) { section(v, "postgres")["password.file"] = "/x" }, "postgres.password.file is not accepted"},
		{"kafka.sasl.password in config", func(v map[string]any) { section(v, "kafka")["sasl.password"] = "pw" }, "kafka.sasl.password is not accepted"},
		{"password in a DSN URL", func(v map[string]any) { pg(orders(v))["dsn"] = "postgres://pgoutbox:pw@db:5432/orders" }, "carries a password"},
		{"password in a DSN query", func(v map[string]any) {
			pg(orders(v))["dsn"] = "postgres://pgoutbox@db/orders?sslmode=require&password=pw"
		}, "carries a password"},
		{"password in a key=value DSN", func(v map[string]any) { pg(orders(v))["dsn"] = "host=db dbname=orders password=pw" }, "carries a password"},
		{"password in the config's DSN", func(v map[string]any) { section(v, "postgres")["dsn"] = "postgres://u:pw@db/x" }, "carries a password"},
		{"password in an inline connector", func(v map[string]any) {
			payments(v)["connector"].(map[string]any)["json"].(map[string]any)["config"].(map[string]any)["database.password"] = "pw"
		}, "connector.json holds database.password"},
		{"metrics.listen in config", func(v map[string]any) { section(v, "metrics")["listen"] = ":1" }, "metrics.listen is set by the chart"},
		{"relay.shutdown.timeout in config", func(v map[string]any) { section(v, "relay")["shutdown.timeout"] = "1m" }, "set shutdownTimeoutSeconds instead"},
		{"two streams of one name", func(v map[string]any) { payments(v)["name"] = "orders" }, `"orders" is given twice`},
		// One slot, one consumer: two streams on it would take it from
		// each other under different settings. A slot's name is one on
		// its server, whatever the database, so streams are compared by
		// server (TestChartAcceptsOneSlotNameOnTwoServers has the other
		// side). The golden's payments connector is on payments-db.db.svc,
		// orders on orders-db.db.svc.
		{"two streams on one slot", func(v map[string]any) {
			connectorConfig(payments(v))["database.hostname"] = "orders-db.db.svc"
			connectorConfig(payments(v))["database.dbname"] = "orders"
			connectorConfig(payments(v))["slot.name"] = "orders_outbox"
		}, `streams orders and payments both use the replication slot "orders_outbox" on the database server orders-db.db.svc:5432 (database orders)`},
		{"one slot name in two databases of one server", func(v map[string]any) {
			connectorConfig(payments(v))["database.hostname"] = "orders-db.db.svc"
			connectorConfig(payments(v))["slot.name"] = "orders_outbox"
		}, `streams orders and payments both use the replication slot "orders_outbox" on the database server orders-db.db.svc:5432 (databases orders and payments)`},
		{"a connector on a stream's default slot", func(v map[string]any) {
			delete(pg(orders(v)), "slot")
			connectorConfig(payments(v))["database.hostname"] = "orders-db.db.svc"
			connectorConfig(payments(v))["slot.name"] = "orders"
		}, `streams orders and payments both use the replication slot "orders" on the database server orders-db.db.svc:5432`},
		{"a connector on Debezium's default slot and a stream named so", func(v map[string]any) {
			pg(orders(v))["slot"] = "debezium"
			pg(orders(v))["dsn"] = "postgres://pgoutbox@payments-db.db.svc/payments"
			delete(connectorConfig(payments(v)), "slot.name")
		}, `streams orders and payments both use the replication slot "debezium" on the database server payments-db.db.svc:5432 (database payments)`},
		{"two connectors on Debezium's default slot", func(v map[string]any) {
			delete(connectorConfig(payments(v)), "slot.name")
			refunds := readValues(t, goldenValues)["streams"].([]any)[1].(map[string]any)
			refunds["name"] = "refunds"
			delete(connectorConfig(refunds), "slot.name")
			connectorConfig(refunds)["database.dbname"] = "refunds"
			v["streams"] = append(v["streams"].([]any), refunds)
		}, `streams payments and refunds both use the replication slot "debezium" on the database server payments-db.db.svc:5432 (databases payments and refunds)`},
		// One server written in the ways the chart can tell are one.
		{"one server, written another way in a connector", func(v map[string]any) {
			connectorConfig(payments(v))["database.hostname"] = "Orders-DB.db.svc.cluster.local."
			connectorConfig(payments(v))["database.port"] = 5432
			connectorConfig(payments(v))["slot.name"] = "orders_outbox"
		}, `streams orders and payments both use the replication slot "orders_outbox" on the database server orders-db.db.svc:5432`},
		{"one server, in a key=value DSN and a connector", func(v map[string]any) {
			pg(orders(v))["dsn"] = "host=payments-db.db.svc port=5432 dbname=orders sslmode=require"
			pg(orders(v))["slot"] = "payments_outbox"
		}, `streams orders and payments both use the replication slot "payments_outbox" on the database server payments-db.db.svc:5432 (databases orders and payments)`},
		{"one server, in a DSN's query and a connector", func(v map[string]any) {
			pg(orders(v))["dsn"] = "postgresql:///orders?host=payments-db.db.svc&port=5432"
			pg(orders(v))["slot"] = "payments_outbox"
		}, `streams orders and payments both use the replication slot "payments_outbox" on the database server payments-db.db.svc:5432`},
		{"one server, by the config's DSN and a short name of the release's namespace", func(v map[string]any) {
			delete(pg(orders(v)), "dsn")
			section(v, "postgres")["dsn"] = "postgres://pgoutbox@payments-db/orders"
			pg(orders(v))["slot"] = "payments_outbox"
			connectorConfig(payments(v))["database.hostname"] = "payments-db." + namespace + ".svc"
		}, `streams orders and payments both use the replication slot "payments_outbox" on the database server payments-db.` + namespace + `.svc:5432`},
		{"one server, by its IPv6 address", func(v map[string]any) {
			pg(orders(v))["dsn"] = "postgres://pgoutbox@[FD00::5]:5433/orders"
			pg(orders(v))["slot"] = "payments_outbox"
			connectorConfig(payments(v))["database.hostname"] = "fd00::5"
			connectorConfig(payments(v))["database.port"] = "5433"
		}, `streams orders and payments both use the replication slot "payments_outbox" on the database server [fd00::5]:5433`},
		{"no database", func(v map[string]any) { delete(pg(orders(v)), "dsn") }, "no database"},
		{"dsn and dsnSecret", func(v map[string]any) {
			pg(orders(v))["dsnSecret"] = map[string]any{"name": "s", "key": "dsn"}
		}, "not both"},
		{"a connector and a slot", func(v map[string]any) { pg(payments(v))["slot"] = "x" }, "remove postgres.slot"},
		{"a connector and router options", func(v map[string]any) { payments(v)["router"] = map[string]any{"route.topic": "x"} }, "remove router"},
		{"no brokers", func(v map[string]any) { section(v, "kafka")["brokers"] = []any{} }, "kafka.brokers is empty"},
		{"a memory limit pgoutbox cannot be sized from", func(v map[string]any) {
			orders(v)["resources"] = map[string]any{"limits": map[string]any{"memory": "1.5Gi"}}
		}, "resources.limits.memory"},
		{"a name too long for a label", func(v map[string]any) { orders(v)["name"] = strings.Repeat("x", 55) }, "longer than 63 characters"},
		// values.schema.json
		{"a Secret without its key", func(v map[string]any) { pg(orders(v))["passwordSecret"] = map[string]any{"name": "s"} }, "missing property 'key'"},
		{"a misspelt stream key", func(v map[string]any) { orders(v)["replica"] = 3 }, "additional properties 'replica' not allowed"},
		{"a misspelt top-level key", func(v map[string]any) { v["stream"] = []any{} }, "additional properties 'stream' not allowed"},
		{"a bad stream name", func(v map[string]any) { orders(v)["name"] = "Orders_EU" }, "/streams/0/name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range helms {
				vals := readValues(t, goldenValues)
				tc.change(vals)
				out, err := h.render(vals)
				if err == nil {
					t.Fatalf("%s renders the values:\n%s", h.name, out)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %q does not say %q", h.name, err, tc.want)
				}
			}
		})
	}
}

// TestChartAcceptsOneSlotNameOnTwoServers: a slot's name is one on its
// server, so two streams may use one name on two servers (two imported
// Debezium connectors both on Debezium's default slot, debezium, say),
// and the chart renders them; where it cannot see a stream's server (a DSN
// or connector in a Secret, a connector's ${env:...}, a server on the
// pod's loopback or socket) it does not refuse either.
func TestChartAcceptsOneSlotNameOnTwoServers(t *testing.T) {
	orders := func(v map[string]any) map[string]any { return v["streams"].([]any)[0].(map[string]any) }
	payments := func(v map[string]any) map[string]any { return v["streams"].([]any)[1].(map[string]any) }
	pg := func(s map[string]any) map[string]any { return s["postgres"].(map[string]any) }
	connectorConfig := func(s map[string]any) map[string]any {
		return s["connector"].(map[string]any)["json"].(map[string]any)["config"].(map[string]any)
	}
	// refunds is a second connector on Debezium's default slot.
	refunds := func(v map[string]any, hostname string) map[string]any {
		delete(connectorConfig(payments(v)), "slot.name")
		r := readValues(t, goldenValues)["streams"].([]any)[1].(map[string]any)
		r["name"] = "refunds"
		delete(connectorConfig(r), "slot.name")
		connectorConfig(r)["database.hostname"] = hostname
		v["streams"] = append(v["streams"].([]any), r)
		return r
	}
	for _, tc := range []struct {
		name   string
		change func(v map[string]any)
	}{
		{"two connectors on Debezium's default slot on two servers", func(v map[string]any) { refunds(v, "refunds-db.db.svc") }},
		{"two connectors on one host, two ports", func(v map[string]any) {
			connectorConfig(refunds(v, "payments-db.db.svc"))["database.port"] = "5433"
		}},
		{"a stream and a connector on one slot name, two servers", func(v map[string]any) {
			pg(orders(v))["slot"] = "payments_outbox"
		}},
		{"a key=value DSN on another server", func(v map[string]any) {
			pg(orders(v))["dsn"] = "host=orders-db.db.svc dbname=payments"
			pg(orders(v))["slot"] = "payments_outbox"
		}},
		{"a DSN in a Secret", func(v map[string]any) {
			delete(pg(orders(v)), "dsn")
			pg(orders(v))["dsnSecret"] = map[string]any{"name": "orders-db-dsn", "key": "dsn"}
			pg(orders(v))["slot"] = "payments_outbox"
		}},
		{"a connector in a Secret", func(v map[string]any) {
			refunds(v, "payments-db.db.svc")["connector"] = map[string]any{"secret": map[string]any{"name": "refunds-connector", "key": "connector.json"}}
		}},
		{"a connector's host from its environment", func(v map[string]any) {
			refunds(v, "${env:REFUNDS_DB_HOST}")
		}},
		{"servers on each pod's loopback", func(v map[string]any) {
			pg(orders(v))["dsn"] = "postgres://pgoutbox@127.0.0.1:5432/app"
			pg(orders(v))["slot"] = "debezium"
			refunds(v, "localhost")
		}},
		{"no host in the DSN", func(v map[string]any) {
			pg(orders(v))["dsn"] = "dbname=payments"
			pg(orders(v))["slot"] = "payments_outbox"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range helms {
				vals := readValues(t, goldenValues)
				tc.change(vals)
				if _, err := h.render(vals); err != nil {
					t.Errorf("%s refuses the values: %v", h.name, err)
				}
			}
		})
	}
}

// TestChartRefusesOneTransactionalIDForSeveralStreams: each exactly-once
// start fences every earlier producer of its transactional id, so streams
// sharing one fence each other at every start and their pods exit 1 in
// turn. The chart refuses an id that more than one stream ends up with
// where the mode is on, naming the streams and the id; an id in the
// release's config is merged into every stream. A stream whose connector
// is in a Secret may turn the mode on there (exactly.once.support), so it
// counts as on.
func TestChartRefusesOneTransactionalIDForSeveralStreams(t *testing.T) {
	orders := func(v map[string]any) map[string]any { return v["streams"].([]any)[0].(map[string]any) }
	payments := func(v map[string]any) map[string]any { return v["streams"].([]any)[1].(map[string]any) }
	releaseKafka := func(v map[string]any) map[string]any { return v["config"].(map[string]any)["kafka"].(map[string]any) }
	// streamKafka is a stream's config.kafka, made if missing.
	streamKafka := func(s map[string]any) map[string]any {
		if s["config"] == nil {
			s["config"] = map[string]any{}
		}
		cfg := s["config"].(map[string]any)
		if cfg["kafka"] == nil {
			cfg["kafka"] = map[string]any{}
		}
		return cfg["kafka"].(map[string]any)
	}
	connectorConfig := func(s map[string]any) map[string]any {
		return s["connector"].(map[string]any)["json"].(map[string]any)["config"].(map[string]any)
	}
	// billing is a third stream, its connector in a Secret.
	billing := func(v map[string]any) map[string]any {
		b := map[string]any{"name": "billing", "connector": map[string]any{"secret": map[string]any{"name": "billing-connector", "key": "connector.json"}}}
		v["streams"] = append(v["streams"].([]any), b)
		return b
	}
	for _, tc := range []struct {
		name   string
		change func(v map[string]any)
		want   string // "" for values the chart must render
	}{
		{"one id and the mode for the whole release", func(v map[string]any) {
			releaseKafka(v)["exactly.once"] = true
			releaseKafka(v)["transactional.id"] = "pgoutbox"
		}, `streams orders, payments use the one kafka.transactional.id "pgoutbox" with exactly-once on (or, for a connector in a Secret, possibly on; config.kafka.transactional.id, which is merged into every stream, sets it)`},
		{"one id for the release, the mode per stream and from a connector", func(v map[string]any) {
			releaseKafka(v)["transactional.id"] = "pgoutbox"
			streamKafka(orders(v))["exactly.once"] = true
			connectorConfig(payments(v))["exactly.once.support"] = "Required"
		}, `streams orders, payments use the one kafka.transactional.id "pgoutbox"`},
		{"one id set by each of two streams", func(v map[string]any) {
			releaseKafka(v)["exactly.once"] = true
			streamKafka(orders(v))["transactional.id"] = "outbox-tx"
			streamKafka(payments(v))["transactional.id"] = "outbox-tx"
		}, `streams orders, payments use the one kafka.transactional.id "outbox-tx" with exactly-once on (or, for a connector in a Secret, possibly on; each stream's config sets it)`},
		{"one id for three streams, one a connector in a Secret", func(v map[string]any) {
			releaseKafka(v)["exactly.once"] = true
			releaseKafka(v)["transactional.id"] = "pgoutbox"
			billing(v)
		}, `streams orders, payments, billing use the one kafka.transactional.id "pgoutbox"`},
		{"a connector in a Secret and a stream with the mode on", func(v map[string]any) {
			releaseKafka(v)["transactional.id"] = "pgoutbox"
			streamKafka(orders(v))["exactly.once"] = true
			billing(v)
		}, `streams orders, billing use the one kafka.transactional.id "pgoutbox"`},

		// Rendered: the id is unused without the mode, ids of their own,
		// or one stream in the mode.
		{"one id for the release without the mode", func(v map[string]any) {
			releaseKafka(v)["transactional.id"] = "pgoutbox"
		}, ""},
		{"one id for the release, the mode in one stream", func(v map[string]any) {
			releaseKafka(v)["transactional.id"] = "pgoutbox"
			streamKafka(orders(v))["exactly.once"] = true
			connectorConfig(payments(v))["exactly.once.support"] = "requested"
		}, ""},
		{"an id of its own for each stream", func(v map[string]any) {
			releaseKafka(v)["exactly.once"] = true
			streamKafka(orders(v))["transactional.id"] = "orders-tx"
			streamKafka(payments(v))["transactional.id"] = "payments-tx"
		}, ""},
		{"the mode for the release, ids derived from the slots", func(v map[string]any) {
			releaseKafka(v)["exactly.once"] = true
			billing(v)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range helms {
				vals := readValues(t, goldenValues)
				tc.change(vals)
				out, err := h.render(vals)
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("%s refuses the values: %v", h.name, err)
				case tc.want != "" && err == nil:
					t.Fatalf("%s renders the values:\n%s", h.name, out)
				case tc.want != "" && !strings.Contains(err.Error(), tc.want):
					t.Errorf("%s: error %q does not say %q", h.name, err, tc.want)
				}
			}
		})
	}
}
