package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// onlyDurabilityWarnings fails the test if a WARN line, or a fix: line,
// belongs to another check than the durability audit's.
func onlyDurabilityWarnings(t *testing.T, r cmdResult) {
	t.Helper()
	durability := false
	for _, line := range strings.Split(r.stdout, "\n") {
		switch {
		case strings.HasPrefix(line, "PASS "), strings.HasPrefix(line, "WARN "), strings.HasPrefix(line, "FAIL "):
			check, _, _ := strings.Cut(line, ": ")
			durability = strings.Contains(check, "durability")
			if strings.HasPrefix(line, "WARN ") && !durability {
				t.Fatalf("a warning that is not the durability audit's: %s\n%s", line, r)
			}
		case strings.HasPrefix(line, "  fix: ") && !durability:
			t.Fatalf("a fix that is not the durability audit's: %s\n%s", line, r)
		}
	}
}

func TestTopicDurabilityFindings(t *testing.T) {
	brokers := []string{"k1:9092"}
	state := func(rf int, configs map[string]string) kafka.TopicState {
		return kafka.TopicState{Topic: "t", Partitions: 3, ReplicationFactor: rf, Configs: configs}
	}
	for _, c := range []struct {
		name  string
		state kafka.TopicState
		want  []string // status and a part of the detail, per line
	}{
		{"three replicas, two in sync", state(3, map[string]string{"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}),
			[]string{"PASS each acknowledged record is on 2 brokers at least"}},
		{"Kafka's default min.insync.replicas", state(3, map[string]string{"min.insync.replicas": "1"}),
			[]string{"WARN replication factor 3 but min.insync.replicas 1"}},
		{"one replica", state(1, map[string]string{"min.insync.replicas": "1"}),
			[]string{"WARN replication factor 1: each record Kafka acknowledges is on one broker only"}},
		{"unclean election", state(3, map[string]string{"min.insync.replicas": "2", "unclean.leader.election.enable": "true"}),
			[]string{"WARN unclean.leader.election.enable is true"}},
		{"as many in sync as replicas", state(3, map[string]string{"min.insync.replicas": "3"}),
			[]string{"WARN one broker down stops every write"}},
		{"more in sync than replicas", state(1, map[string]string{"min.insync.replicas": "2"}),
			[]string{"FAIL min.insync.replicas 2 exceeds the replication factor 1"}},
		{"more in sync than replicas, replicated", state(2, map[string]string{"min.insync.replicas": "3"}),
			[]string{"FAIL min.insync.replicas 3 exceeds the replication factor 2"}},
		{"configuration not described", state(3, nil),
			[]string{"WARN min.insync.replicas and unclean.leader.election.enable unknown"}},
		{"missing topic", kafka.TopicState{Topic: "t", Err: kafka.ErrTopicMissing}, nil},
		{"refused topic", kafka.TopicState{Topic: "t", Err: errors.New("denied")}, nil},
	} {
		got := checkTopicDurability(c.state, "topic", brokers)
		if len(got) != len(c.want) {
			t.Errorf("%s: %d findings, want %d: %+v", c.name, len(got), len(c.want), got)
			continue
		}
		for i, w := range c.want {
			status, part, _ := strings.Cut(w, " ")
			if got[i].Status != status || !strings.Contains(got[i].Detail, part) || got[i].Name != "topic t durability" {
				t.Errorf("%s: got %s %s: %s, want %s ...%s...", c.name, got[i].Status, got[i].Name, got[i].Detail, status, part)
			}
			if status != checkPass && !strings.Contains(got[i].Fix, "kafka-") {
				t.Errorf("%s: the fix names no command: %q", c.name, got[i].Fix)
			}
		}
	}
}

func TestPostgresDurabilityFindings(t *testing.T) {
	gib := int64(1 << 30)
	held, left := gib/2, gib/2
	full, none := gib*9/10, gib/10
	for _, c := range []struct {
		name   string
		got    checkResult
		status string
		part   string
	}{
		{"no limit", checkWALKeep(pgDurability{maxSlotWALKeep: -1}, "s"), checkWarn, "-1 (no limit)"},
		{"a limit, no slot yet", checkWALKeep(pgDurability{maxSlotWALKeep: gib}, "s"), checkPass, "up to that much WAL once it exists; past the limit the slot is lost"},
		{"a limit, half used", checkWALKeep(pgDurability{maxSlotWALKeep: gib, slotExists: true, retained: &held, safe: &left}, "s"), checkPass, "(512.0 MiB) to go (safe_wal_size)"},
		{"a limit, nearly used", checkWALKeep(pgDurability{maxSlotWALKeep: gib, slotExists: true, retained: &full, safe: &none}, "s"), checkWarn, "% of the limit"},
		{"timeout off", checkWALSenderTimeout(0, time.Second), checkWarn, "0 (off)"},
		{"timeout below the interval", checkWALSenderTimeout(500*time.Millisecond, time.Second), checkWarn, "500ms, and pgoutbox sends a status update only every 1s"},
		{"timeout under twice the interval", checkWALSenderTimeout(1500*time.Millisecond, time.Second), checkWarn, "replication timeout"},
		{"timeout well above", checkWALSenderTimeout(time.Minute, time.Second), checkPass, "well within it"},
	} {
		if c.got.Status != c.status || !strings.Contains(c.got.Detail, c.part) {
			t.Errorf("%s: got %s %s, want %s ...%s...", c.name, c.got.Status, c.got.Detail, c.status, c.part)
		}
		if c.status == checkWarn && c.got.Fix == "" {
			t.Errorf("%s: a warning without a fix", c.name)
		}
	}
}

// TestValidateAuditsTopicDurability: on the three-node cluster a topic with
// min.insync.replicas=1 (Kafka's default) is reported, one with two passes,
// and one with unclean leader election on is reported; on the single broker
// a topic with one replica is reported, the dead-letter topic too, and one
// whose min.insync.replicas exceeds its replicas fails. None of it blocks
// validate but --strict.
func TestValidateAuditsTopicDurability(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	c := testenv.RequireCluster(t)
	safe, loose, unclean := testenv.UniqueName(t, "safe"), testenv.UniqueName(t, "loose"), testenv.UniqueName(t, "unclean")
	c.CreateTopic(t, safe, 3)
	c.CreateTopicWith(t, loose, testenv.TopicSpec{Partitions: 3, Configs: map[string]string{"min.insync.replicas": "1"}})
	c.CreateTopicWith(t, unclean, testenv.TopicSpec{Partitions: 1, Configs: map[string]string{"unclean.leader.election.enable": "true"}})
	cluster := f.environ(f.dsn, "PGOUTBOX_KAFKA_BROKERS="+strings.Join(c.KafkaBrokers, ","))
	r := invoke(cmdValidate, []string{"--topics", strings.Join([]string{safe, loose, unclean}, ",")}, cluster)
	if r.code != exitOK {
		t.Fatalf("want exit 0 (warnings only):\n%s", r)
	}
	wantLine(t, r, `^PASS topic `+safe+` durability: replication factor 3, min.insync.replicas 2, unclean leader election off: each acknowledged record is on 2 brokers at least$`)
	wantLine(t, r, `^WARN topic `+loose+` durability: replication factor 3 but min.insync.replicas 1 \(Kafka's default\): .*loses it, though pgoutbox confirmed it to PostgreSQL$`)
	wantLine(t, r, `^  fix: kafka-configs.sh --bootstrap-server 127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,127\.0\.0\.1:\d+ --alter --entity-type topics --entity-name `+loose+` --add-config min.insync.replicas=2$`)
	wantLine(t, r, `^WARN topic `+unclean+` durability: unclean.leader.election.enable is true: .*events pgoutbox confirmed among them$`)
	wantLine(t, r, `^  fix: .* --entity-name `+unclean+` --add-config unclean.leader.election.enable=false$`)
	if strict := invoke(cmdValidate, []string{"--strict", "--topics", strings.Join([]string{safe, loose, unclean}, ",")}, cluster); strict.code != exitRuntime {
		t.Fatalf("--strict with warnings: want exit 1:\n%s", strict)
	}

	one, impossible, dlq := testenv.UniqueName(t, "one"), testenv.UniqueName(t, "impossible"), testenv.UniqueName(t, "dlq")
	f.env.CreateTopic(t, one, 1)
	f.env.CreateTopic(t, dlq, 1)
	f.env.CreateTopicWith(t, impossible, testenv.TopicSpec{Partitions: 1, Configs: map[string]string{"min.insync.replicas": "2"}})
	single := f.environ(f.dsn, "PGOUTBOX_RELAY_POISON_POLICY=dead-letter", "PGOUTBOX_RELAY_DEAD_LETTER_TOPIC="+dlq)
	r = invoke(cmdValidate, []string{"--topics", one + "," + impossible}, single)
	if r.code != exitRuntime {
		t.Fatalf("want exit 1 (a topic nothing can be written to):\n%s", r)
	}
	wantLine(t, r, `^WARN topic `+one+` durability: replication factor 1: each record Kafka acknowledges is on one broker only; .*will never send again$`)
	wantLine(t, r, `^WARN dead-letter topic `+dlq+` durability: replication factor 1: `)
	wantLine(t, r, `^FAIL topic `+impossible+` durability: min.insync.replicas 2 exceeds the replication factor 1: the brokers refuse every record`)
}

// TestValidateAuditsPostgresDurability: the test server has no
// max_slot_wal_keep_size (a warning), a walsender's wal_sender_timeout can
// be lowered below the status interval in the DSN's options (a warning),
// and with a limit set validate says how much headroom the slot has.
func TestValidateAuditsPostgresDurability(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.ready(t)
		r := invoke(cmdValidate, nil, f.environ(f.dsn))
		wantLine(t, r, `^WARN durability max_slot_wal_keep_size: -1 \(no limit\): while pgoutbox is stopped or cannot deliver \(Kafka down\), slot "`+f.slot+`" keeps every WAL segment`)
		wantLine(t, r, `^  fix: set a limit the disk can hold, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; .*past it the slot is lost`)
		wantLine(t, r, `^PASS durability wal_sender_timeout: 1m0s; pgoutbox sends a status update at least every 1s \(postgres.status.update.interval\), well within it$`)
		if r.code != exitOK {
			t.Fatalf("warnings must not fail validate:\n%s", r)
		}
		if strict := invoke(cmdValidate, []string{"--strict"}, f.environ(f.dsn)); strict.code != exitRuntime {
			t.Fatalf("--strict with warnings: want exit 1:\n%s", strict)
		}

		short := f.dsn + "&options=-c%20wal_sender_timeout%3D1s"
		r = invoke(cmdValidate, nil, f.environ(short))
		wantLine(t, r, `^WARN durability wal_sender_timeout: 1s, and pgoutbox sends a status update only every 1s \(postgres.status.update.interval\): .*duplicates\)$`)
		wantLine(t, r, `^  fix: set postgres.status.update.interval to at most 500ms \(half of wal_sender_timeout\)`)
		r = invoke(cmdValidate, nil, f.environ(short, "PGOUTBOX_POSTGRES_STATUS_UPDATE_INTERVAL=400ms"))
		wantLine(t, r, `^PASS durability wal_sender_timeout: 1s; pgoutbox sends a status update at least every 400ms`)
	})

	t.Run("a limit", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		env.SetServerSetting(t, "max_slot_wal_keep_size", "1GB")
		f := newFixture(t)
		f.ready(t)
		r := invoke(cmdValidate, nil, f.environ(f.dsn))
		wantLine(t, r, `^PASS durability max_slot_wal_keep_size: 1073741824 \(1\.0 GiB\): slot "`+f.slot+`" may hold back up to that much WAL; it holds \d+.*, \d+ .* to go \(safe_wal_size\); past the limit the slot is lost \(wal_status lost\): the events not yet relayed are gone with it and pgoutbox stops$`)
	})
}
