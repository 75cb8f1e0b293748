package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
)

// describeIgnored adds the reason to each ignored connector key we know.
func describeIgnored(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k
		why := connectorIgnored[k]
		if opt, ok := strings.CutPrefix(k, "transforms."); ok && why == "" {
			if _, o, ok := strings.Cut(opt, "."); ok {
				why = routerIgnored[o]
			}
		}
		if why != "" {
			out[i] = k + " (" + why + ")"
		}
	}
	return out
}

// cmdConvert prints the native configuration equivalent to a connector
// JSON. The database password is left out: give it with
// PGOUTBOX_POSTGRES_PASSWORD, postgres.password.file or PGPASSWORD.
func cmdConvert(args, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("convert", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: pgoutbox convert connector.json\n\nPrints the pgoutbox YAML configuration equivalent to a Debezium PostgreSQL connector\nconfiguration with the outbox EventRouter transform. Kafka brokers are not part of a\nconnector configuration: add kafka.brokers.")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitConfig
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitConfig
	}
	conn, err := readConnector(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitConfig
	}
	cfg := defaultFileConfig()
	// The connector section (config providers) may come from the
	// environment, as for run.
	envCfg := defaultFileConfig()
	if err := applyEnv(&envCfg, environ, envReferences(conn)...); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitConfig
	}
	cfg.Connector = envCfg.Connector
	ignored, err := applyConnector(&cfg, conn)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitConfig
	}
	// What run would refuse, convert refuses: the same checks, with a
	// stand-in for the brokers a connector does not name.
	check := cfg
	if len(check.Kafka.Brokers) == 0 {
		check.Kafka.Brokers = []string{"kafka:9092"}
	}
	if err := check.Config.Validate(); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	hadPassword := false
	if u, err := url.Parse(cfg.Postgres.DSN); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			hadPassword = true
			u.User = url.User(u.User.Username())
			cfg.Postgres.DSN = u.String()
		}
	}
	out, err := yaml.Marshal(&cfg)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintf(stdout, "# pgoutbox configuration converted from %s\n", fs.Arg(0))
	fmt.Fprintln(stdout, "# kafka.brokers: set them here or with PGOUTBOX_KAFKA_BROKERS (a connector does not name them)")
	if hadPassword {
		fmt.Fprintln(stdout, "# the database password is not written here: set PGOUTBOX_POSTGRES_PASSWORD or postgres.password.file (or PGPASSWORD)")
	}
	if d := cfg.Messages.Debezium; d != nil && d.Topic != "" && !writesNoMessage(d) && cfg.Messages.Format != relay.MessagesDebezium {
		fmt.Fprintf(stdout, "# logical decoding messages: Debezium writes those its message.prefix.include.list / exclude.list let through to %s (its EventRouter routes rows only); so does pgoutbox, but for those of messages.prefix (%q), which it routes as outbox events, and none without a JsonConverter value and a StringConverter or JsonConverter key (whose bytes it does not reproduce), under exactly-once, or with a list Go cannot read: run names each such prefix it meets at Warn. The topic must exist. If no one reads that topic, set message.prefix.exclude.list=.* in the connector JSON\n", d.Topic, cfg.Messages.Prefix)
	}
	for _, k := range describeIgnored(ignored) {
		fmt.Fprintf(stdout, "# ignored: %s\n", k)
	}
	fmt.Fprint(stdout, strings.TrimRight(string(out), "\n")+"\n")
	return exitOK
}
