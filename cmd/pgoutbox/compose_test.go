package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeFileRunsPgoutboxWithItsConfig checks docker-compose.yml's
// structure (no Docker engine runs here): the services, PostgreSQL's
// wal_level, health checks, the consumer that prints the records, and that
// the config it mounts loads and validates with the DSN, brokers and
// metrics address the file sets.
func TestComposeFileRunsPgoutboxWithItsConfig(t *testing.T) {
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Build       any               `yaml:"build"`
			Entrypoint  []string          `yaml:"entrypoint"`
			Command     []string          `yaml:"command"`
			Ports       []string          `yaml:"ports"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Healthcheck *struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
			DependsOn map[string]map[string]string `yaml:"depends_on"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"postgres", "kafka", "migrate", "pgoutbox", "consumer", "demo"} {
		if _, ok := compose.Services[name]; !ok {
			t.Fatalf("service %q missing", name)
		}
	}
	pg := compose.Services["postgres"]
	if !strings.Contains(strings.Join(pg.Command, " "), "wal_level=logical") || pg.Healthcheck == nil {
		t.Fatalf("postgres service needs wal_level=logical and a health check: %+v", pg)
	}
	if compose.Services["kafka"].Healthcheck == nil || compose.Services["kafka"].Environment["KAFKA_PROCESS_ROLES"] != "broker,controller" {
		t.Fatal("kafka service must be a KRaft broker+controller with a health check")
	}
	p := compose.Services["pgoutbox"]
	if len(p.Command) == 0 || p.Command[0] != "run" || p.Build == nil {
		t.Fatalf("pgoutbox service must build the image and run `run`: %+v", p)
	}
	if p.DependsOn["migrate"]["condition"] != "service_completed_successfully" {
		t.Fatal("pgoutbox must start after the migration completed")
	}
	// The consumer prints the outbox topics' records (those pgoutbox-demo
	// writes to) with keys and headers, from the start.
	c := compose.Services["consumer"]
	consume := strings.Join(append(c.Entrypoint, c.Command...), " ")
	for _, want := range []string{"kafka-console-consumer.sh", "--bootstrap-server kafka:9092", `--include outbox\.event\..*`, "--from-beginning", "print.key=true", "print.headers=true"} {
		if !strings.Contains(consume, want) {
			t.Errorf("consumer service runs %q, which lacks %q", consume, want)
		}
	}
	if !strings.HasPrefix(c.Image, "apache/kafka:") || c.DependsOn["topics"]["condition"] != "service_completed_successfully" {
		t.Errorf("consumer service: image %q, depends on %v; want Kafka's image, after the topics exist", c.Image, c.DependsOn)
	}
	var mounted string
	for _, v := range p.Volumes {
		host, target, _ := strings.Cut(v, ":")
		if strings.HasPrefix(target, p.Environment["PGOUTBOX_CONFIG"]) {
			mounted = "../../" + strings.TrimPrefix(host, "./")
		}
	}
	if mounted == "" {
		t.Fatalf("the config named by PGOUTBOX_CONFIG (%q) is not mounted", p.Environment["PGOUTBOX_CONFIG"])
	}
	var environ []string
	for k, v := range p.Environment {
		environ = append(environ, k+"="+v)
	}
	cfg, err := loadConfig(mounted, environ)
	if err != nil {
		t.Fatalf("mounted config: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("mounted config with the compose environment does not validate: %v", err)
	}
	if cfg.Kafka.Brokers[0] != "kafka:9092" || !strings.Contains(cfg.Postgres.DSN, "@postgres:5432/") {
		t.Fatalf("pgoutbox does not point at the compose services: %v %q", cfg.Kafka.Brokers, cfg.Postgres.DSN)
	}
	if err := cfg.Metrics.Validate(); err != nil || cfg.Metrics.Listen == "" {
		t.Fatalf("metrics.listen %q: %v", cfg.Metrics.Listen, err)
	}
	_, port, _ := strings.Cut(cfg.Metrics.Listen, ":")
	if !slices.Contains(p.Ports, port+":"+port) {
		t.Errorf("the metrics port %s is not published (ports %v)", port, p.Ports)
	}
}

// TestDockerfileBuildsAStaticNonRootImage checks the Dockerfile the compose
// file and the Helm chart run: pgoutbox built without cgo (the final image
// has no C library), on a static distroless base, as a numeric non-root
// user (Kubernetes checks runAsNonRoot only against a number), with
// pgoutbox as the entry point.
func TestDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var from, user, entrypoint string
	static := false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "FROM":
			from, user = f[1], "" // each stage starts as root
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			entrypoint = strings.Join(f[1:], " ")
		case "RUN":
			static = static || strings.Contains(line, "CGO_ENABLED=0 go build") && strings.Contains(line, "./cmd/pgoutbox")
		}
	}
	if !static {
		t.Error("pgoutbox is not built with CGO_ENABLED=0")
	}
	if !strings.HasPrefix(from, "gcr.io/distroless/static") && from != "scratch" {
		t.Errorf("final stage FROM %s: want a static distroless image (or scratch)", from)
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("final stage USER %q: want a numeric non-root user", user)
	}
	if !strings.Contains(entrypoint, "/usr/local/bin/pgoutbox\"") {
		t.Errorf("ENTRYPOINT %s: want pgoutbox", entrypoint)
	}
}
