//go:build unix

package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestValidateConfigOnlyChecksSettingsAndConnectsToNothing runs
// validate --config-only on settings from each source run reads (file,
// environment, flags, connector JSON), with PostgreSQL and Kafka pointed at
// a listener that must see no connection.
func TestValidateConfigOnlyChecksSettingsAndConnectsToNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()

	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	config := write("config.yaml", "postgres:\n  dsn: postgres://app@"+addr+"/shop\n  password.file: "+
		write("pg-password", "pw\n")+"\nkafka:\n  brokers: ["+addr+"]\nmetrics:\n  listen: :9180\n")
	sasl := write("kafka-password", "pw\n")
	saslEnv := []string{"PGOUTBOX_KAFKA_SECURITY_PROTOCOL=SASL_SSL", "PGOUTBOX_KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "PGOUTBOX_KAFKA_SASL_USERNAME=pgoutbox"}

	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
		code    int
		want    string // in the output
	}{
		{"valid file", []string{"--config", config}, nil, exitOK, "PASS config: valid"},
		{"file named by PGOUTBOX_CONFIG", nil, []string{"PGOUTBOX_CONFIG=" + config}, exitOK, "PASS config: valid"},
		{"SASL password file", []string{"--config", config}, append(saslEnv, "PGOUTBOX_KAFKA_SASL_PASSWORD_FILE="+sasl), exitOK, "PASS config: valid"},
		{"connector JSON", []string{"--config", config, "--connector", "testdata/connector.json"}, nil, exitOK, "PASS config: valid"},
		{"bad relay setting from the environment", []string{"--config", config}, []string{"PGOUTBOX_RELAY_POISON_POLICY=explode"}, exitConfig, "poison.policy"},
		{"bad slot from a flag", []string{"--config", config, "--slot", "Not-A-Slot"}, nil, exitConfig, "slot"},
		{"bad metrics setting", []string{"--config", config}, []string{"PGOUTBOX_METRICS_LISTEN=nonsense"}, exitConfig, "metrics: listen"},
		{"bad log level", []string{"--config", config, "--log-level", "loud"}, nil, exitConfig, "log.level"},
		{"missing SASL password file", []string{"--config", config}, append(saslEnv, "PGOUTBOX_KAFKA_SASL_PASSWORD_FILE="+filepath.Join(dir, "missing")), exitConfig, "sasl.password.file"},
		{"unknown key in the file", []string{"--config", write("typo.yaml", "postgres:\n  slot.nmae: x\n")}, nil, exitConfig, "slot.nmae"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := invoke(cmdValidate, append([]string{"--config-only"}, tc.args...), tc.environ)
			if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
				t.Fatalf("want exit %d and %q in the output, got %s", tc.code, tc.want, r)
			}
		})
	}
	if n := pendingConnections(t, ln); n > 0 {
		t.Fatalf("validate --config-only connected %d times to the servers of its configuration", n)
	}
}

// pendingConnections accepts, without waiting, whatever connections the
// kernel completed for ln: a client's connect returns only once the
// handshake is done, so each connection made before this call is there.
func pendingConnections(t *testing.T, ln net.Listener) int {
	t.Helper()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var acceptErr error
	// A listener's raw connection supports Control only; its descriptor is
	// non-blocking, so accept says EAGAIN once the queue is empty.
	err = rc.Control(func(fd uintptr) {
		for {
			nfd, _, err := syscall.Accept(int(fd))
			if err != nil {
				if !errors.Is(err, syscall.EAGAIN) {
					acceptErr = err
				}
				return
			}
			syscall.Close(nfd)
			n++
		}
	})
	if err != nil || acceptErr != nil {
		t.Fatalf("accept: %v %v", err, acceptErr)
	}
	return n
}
