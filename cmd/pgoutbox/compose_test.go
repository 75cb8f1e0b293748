package main

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeFileRunsPgoutboxWithItsConfig checks docker-compose.yml's
// structure (no Docker engine runs here): the services, PostgreSQL's
// wal_level, health checks, and that the config it mounts loads and
// validates with the DSN and brokers the file sets.
func TestComposeFileRunsPgoutboxWithItsConfig(t *testing.T) {
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Build       any               `yaml:"build"`
			Command     []string          `yaml:"command"`
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
	for _, name := range []string{"postgres", "kafka", "migrate", "pgoutbox", "demo"} {
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
}
