package deploy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// secretStandIns are the contents of the Secrets the test values name,
// by "name/key"; any other Secret key reads as a stand-in password.
var secretStandIns = map[string]string{
	"inventory-db-dsn/dsn": "postgres://pgoutbox@inventory-db.db.svc:5432/inventory?sslmode=verify-full&sslrootcert=/etc/pgoutbox-ca/ca.pem",
	"billing-connector/connector.json": `{"name": "billing", "config": {
		"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname": "billing-db.db.svc", "database.port": "5432",
		"database.user": "debezium", "database.password": "stand-in-password", "database.dbname": "billing",
		"plugin.name": "pgoutput", "slot.name": "billing_outbox", "publication.name": "billing_outbox",
		"table.include.list": "public.outbox", "snapshot.mode": "no_data",
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"key.converter": "org.apache.kafka.connect.storage.StringConverter",
		"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false"}}`,
}

// externalConfigMap stands in for a ConfigMap the test values mount but
// the chart does not render: db-ca, a CA bundle the DSN's sslrootcert
// names, which pgoutbox reads when it parses the DSN.
func externalConfigMap(t *testing.T, name string) map[string]string {
	t.Helper()
	if name != "db-ca" {
		t.Fatalf("the test has no stand-in for ConfigMap %s", name)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stand-in CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"ca.pem": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
	buildOut  []byte
)

// pgoutbox builds the binary the image holds, once, from the relay's
// module.
func pgoutbox(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgoutbox-deploy-test-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "pgoutbox")
		cmd := exec.Command("go", "build", "-o", binary, "./cmd/pgoutbox")
		cmd.Dir = repoPath(".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/pgoutbox: %v\n%s", buildErr, buildOut)
	}
	return binary
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" {
		os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// pod is a Deployment's container laid out on this machine: its volumes
// written under a temporary root, and its paths, arguments and
// environment pointed there.
type pod struct {
	root  string
	paths *strings.Replacer // pod path -> path under root
	args  []string
	env   []string
}

// mount lays out d's container: each ConfigMap volume's keys as files,
// each Secret volume's items and each ConfigMap the chart does not render
// as stand-ins, other volumes as empty directories; the pod's paths in
// the files and the environment point under the root.
func mount(t *testing.T, d *appsv1.Deployment, o objects) pod {
	t.Helper()
	p := pod{root: t.TempDir()}
	c := d.Spec.Template.Spec.Containers[0]
	mounts := slices.Clone(c.VolumeMounts)
	// Longest first, so that a mount inside another maps to itself.
	slices.SortFunc(mounts, func(a, b corev1.VolumeMount) int { return len(b.MountPath) - len(a.MountPath) })
	var pairs []string
	for _, m := range mounts {
		pairs = append(pairs, m.MountPath, filepath.Join(p.root, m.MountPath))
	}
	p.paths = strings.NewReplacer(pairs...)
	volumes := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range mounts {
		dir := filepath.Join(p.root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("%s mounts volume %s, which it does not define", d.Name, m.Name)
		}
		files := map[string]string{}
		switch {
		case v.ConfigMap != nil:
			cm, ok := o.configMaps[v.ConfigMap.Name]
			if !ok {
				// Not the chart's: one the values mount (extraVolumes).
				files = externalConfigMap(t, v.ConfigMap.Name)
				break
			}
			for k, data := range cm.Data {
				files[k] = p.paths.Replace(data)
			}
		case v.Secret != nil:
			if len(v.Secret.Items) == 0 {
				t.Fatalf("%s: Secret volume %s mounts every key; the chart names the one it needs", d.Name, v.Name)
			}
			for _, it := range v.Secret.Items {
				content, ok := secretStandIns[v.Secret.SecretName+"/"+it.Key]
				if !ok {
					content = "stand-in-password\n"
				}
				files[it.Path] = p.paths.Replace(content)
			}
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o400); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, a := range c.Args {
		p.args = append(p.args, p.paths.Replace(a))
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			p.env = append(p.env, e.Name+"="+p.paths.Replace(e.Value))
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secretStandIns[ref.Name+"/"+ref.Key]
			if !ok {
				t.Fatalf("%s: %s comes from Secret %s key %s, which the test has no stand-in for", d.Name, e.Name, ref.Name, ref.Key)
			}
			p.env = append(p.env, e.Name+"="+p.paths.Replace(v))
		default:
			t.Fatalf("%s: environment variable %s from %+v", d.Name, e.Name, e.ValueFrom)
		}
	}
	return p
}

// validate runs `pgoutbox validate --config-only` with the container's
// arguments (run's, after "run") and its environment alone.
func (p pod) validate(t *testing.T) (string, error) {
	t.Helper()
	if len(p.args) == 0 || p.args[0] != "run" {
		t.Fatalf("the container runs %q, not pgoutbox run", p.args)
	}
	cmd := exec.Command(pgoutbox(t), append([]string{"validate", "--config-only"}, p.args[1:]...)...)
	cmd.Env = p.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestEveryStreamConfigLoadsWithPgoutbox checks each stream's
// configuration with pgoutbox's own loader and validation, as the pod
// would load it: the Deployment's arguments and environment, the
// ConfigMap's files and a stand-in for each mounted Secret.
func TestEveryStreamConfigLoadsWithPgoutbox(t *testing.T) {
	for _, path := range valuesFiles {
		o := decode(t, mustRender(t, helms[0], path))
		for _, d := range o.deployments {
			t.Run(d.Name, func(t *testing.T) {
				p := mount(t, d, o)
				out, err := p.validate(t)
				if err != nil || !strings.Contains(out, "PASS config: valid") {
					t.Fatalf("%s (%s): pgoutbox validate --config-only: %v\n%s", d.Name, path, err, out)
				}
			})
		}
	}
}

// TestKafkaPasswordFileIsTheMountedSecret removes the stand-in of the
// Kafka password Secret and expects pgoutbox to refuse the configuration:
// the file the config names is the one the Secret is mounted as.
func TestKafkaPasswordFileIsTheMountedSecret(t *testing.T) {
	o := decode(t, mustRender(t, helms[0], goldenValues))
	for _, d := range o.deployments {
		p := mount(t, d, o)
		file := get(streamConfig(t, configMapOf(t, d, o)), "kafka", "sasl.password.file")
		if file == "" {
			t.Fatalf("%s: no kafka.sasl.password.file in its config", d.Name)
		}
		if err := os.Remove(p.paths.Replace(file)); err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
		out, err := p.validate(t)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(out, "sasl.password.file") {
			t.Fatalf("%s: without the Kafka password file: %v\n%s", d.Name, err, out)
		}
	}
}
