package deploy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// objects are the rendered objects of one release, decoded into their API
// types.
type objects struct {
	deployments     []*appsv1.Deployment
	pdbs            []*policyv1.PodDisruptionBudget
	configMaps      map[string]*corev1.ConfigMap
	services        []*corev1.Service
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
}

// decode decodes every document of a manifest strictly into the API type
// its apiVersion and kind name: a field the type does not have (a typo, a
// field at the wrong level) is an error, as is a kind the chart should not
// render.
func decode(t *testing.T, manifest string) objects {
	t.Helper()
	o := objects{configMaps: map[string]*corev1.ConfigMap{}}
	for _, doc := range documents(manifest) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		var obj any
		var keep func()
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			obj, keep = d, func() { o.deployments = append(o.deployments, d) }
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			obj, keep = p, func() { o.pdbs = append(o.pdbs, p) }
		case "v1 ConfigMap":
			c := &corev1.ConfigMap{}
			obj, keep = c, func() { o.configMaps[c.Name] = c }
		case "v1 Service":
			s := &corev1.Service{}
			obj, keep = s, func() { o.services = append(o.services, s) }
		case "monitoring.coreos.com/v1 ServiceMonitor":
			s := &monitoringv1.ServiceMonitor{}
			obj, keep = s, func() { o.serviceMonitors = append(o.serviceMonitors, s) }
		case "monitoring.coreos.com/v1 PrometheusRule":
			r := &monitoringv1.PrometheusRule{}
			obj, keep = r, func() { o.rules = append(o.rules, r) }
		default:
			t.Fatalf("unexpected object %s %s:\n%s", tm.APIVersion, tm.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s does not decode strictly into its API type: %v\n%s", tm.Kind, err, doc)
		}
		keep()
	}
	return o
}

// stream is what a values file asks of one stream.
type stream struct {
	name     string // the objects' name: <fullname>-<stream name>
	replicas int32
}

// streamsOf lists the streams of a values file, with the chart's defaults.
func streamsOf(t *testing.T, vals map[string]any) []stream {
	t.Helper()
	fullname := releaseName // the release name holds the chart's name
	if f, _ := vals["fullnameOverride"].(string); f != "" {
		fullname = f
	}
	var out []stream
	list, _ := vals["streams"].([]any)
	for _, item := range list {
		m := item.(map[string]any)
		s := stream{name: fullname + "-" + m["name"].(string), replicas: 2}
		if r, ok := m["replicas"].(float64); ok {
			s.replicas = int32(r)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		t.Fatal("values without streams")
	}
	return out
}

// chartDefault is a top-level value of the chart's values.yaml.
func chartDefault(t *testing.T, key string) any {
	t.Helper()
	return readValues(t, chartDir+"/values.yaml")[key]
}

// measuredPeakRSS is the highest resident set pgoutbox reached with its
// default in-flight caps: 37-52 MB across the scenarios of make bench
// (bench-results/summary.md, "pgoutbox peak RSS MB") and about 52 MB in the
// fault suite's 200,000-row transaction (make test-faults, faults-report.md).
const measuredPeakRSS = 52_000_000

// TestRenderedObjects decodes what the chart renders for each values file
// and checks what the deployment depends on: per stream a Deployment with
// its replicas, a PodDisruptionBudget and a ConfigMap, probes on the
// metrics port, a grace period covering relay.shutdown.timeout, passwords
// only from Secret files, a locked-down security context, memory sized
// from the measured RSS with GOMEMLIMIT below the limit, and monitoring
// objects that select the pods.
func TestRenderedObjects(t *testing.T) {
	for _, path := range valuesFiles {
		t.Run(strings.TrimSuffix(path[strings.LastIndex(path, "/")+1:], ".yaml"), func(t *testing.T) {
			vals := readValues(t, path)
			o := decode(t, mustRender(t, helms[0], path))
			streams := streamsOf(t, vals)
			if len(o.deployments) != len(streams) || len(o.pdbs) != len(streams) || len(o.configMaps) != len(streams) {
				t.Fatalf("%d streams, but %d Deployments, %d PodDisruptionBudgets and %d ConfigMaps", len(streams), len(o.deployments), len(o.pdbs), len(o.configMaps))
			}
			for _, s := range streams {
				d := findNamed(t, o.deployments, s.name)
				checkDeployment(t, d, s, o)
				checkPDB(t, findNamed(t, o.pdbs, s.name), d, o)
				checkNoPasswordInConfig(t, o.configMaps[s.name])
				checkPasswordFiles(t, d, o.configMaps[s.name])
			}
			for _, d := range o.deployments {
				checkNames(t, d.Name, d.Labels, d.Spec.Template.Labels)
			}
			checkMonitoring(t, o, vals)
		})
	}
}

// named is an object with a name.
type named interface{ GetName() string }

func findNamed[T named](t *testing.T, list []T, name string) T {
	t.Helper()
	for _, x := range list {
		if x.GetName() == name {
			return x
		}
	}
	var zero T
	t.Fatalf("no %T named %s", zero, name)
	return zero
}

func checkDeployment(t *testing.T, d *appsv1.Deployment, s stream, o objects) {
	t.Helper()
	spec := d.Spec
	if spec.Replicas == nil || *spec.Replicas != s.replicas {
		t.Errorf("%s: replicas %v, want %d", d.Name, spec.Replicas, s.replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err != nil {
		t.Fatalf("%s: selector: %v", d.Name, err)
	}
	// The API server refuses a template its selector does not match; a
	// selector that matched another stream's pods would make two
	// Deployments fight over them.
	if !sel.Matches(labels.Set(spec.Template.Labels)) {
		t.Errorf("%s: the selector %s does not match the pod template's labels %v", d.Name, sel, spec.Template.Labels)
	}
	for _, other := range o.deployments {
		if other.Name != d.Name && sel.Matches(labels.Set(other.Spec.Template.Labels)) {
			t.Errorf("%s: the selector %s also matches the pods of %s", d.Name, sel, other.Name)
		}
	}

	// Rolling update: a new pod first, an old one only once the new one
	// has stayed up (minReadySeconds), so a standby is always there.
	ru := spec.Strategy.RollingUpdate
	if spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
		ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("%s: strategy %+v, want RollingUpdate with maxSurge 1 and maxUnavailable 0", d.Name, spec.Strategy)
	}
	if spec.MinReadySeconds < 20 {
		t.Errorf("%s: minReadySeconds %d: a pod that fails its first connection (10 s timeouts) would count as available", d.Name, spec.MinReadySeconds)
	}

	pod := spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", d.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	cm := configMapOf(t, d, o)
	cfg := streamConfig(t, cm)

	// Probes: /healthz (liveness) and /rolloutz (readiness) on the named
	// port that metrics.listen opens.
	port := -1
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = int(p.ContainerPort)
		}
	}
	if listen := get(cfg, "metrics", "listen"); listen != ":"+strconv.Itoa(port) {
		t.Errorf("%s: metrics.listen %q, but the metrics port is %d", d.Name, listen, port)
	}
	for what, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/rolloutz"}} {
		if p := want.p; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want.path || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s: %s probe %+v, want GET %s on port metrics", d.Name, what, p, want.path)
		}
	}

	// The grace period covers the drain (relay.shutdown.timeout) and the
	// final status update (up to 5 s, and 5 s more for the end of the
	// stream) before the kubelet's SIGKILL.
	timeout, err := time.ParseDuration(get(cfg, "relay", "shutdown.timeout"))
	if err != nil {
		t.Fatalf("%s: relay.shutdown.timeout: %v", d.Name, err)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < timeout+10*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want at least relay.shutdown.timeout %s + 10s", d.Name, g, timeout)
	}

	checkSecurity(t, d)
	checkResources(t, d, c)
	checkEnv(t, d, c)

	// The config file run is given lives in the stream's ConfigMap, and a
	// change of it rolls the pods.
	if want := "checksum/config"; spec.Template.Annotations[want] != sha256Hex(strings.TrimSuffix(cm.Data["config.yaml"], "\n")) {
		t.Errorf("%s: annotation %s is not the checksum of the ConfigMap's config.yaml", d.Name, want)
	}
	if len(c.Args) < 3 || c.Args[0] != "run" || c.Args[1] != "--config" {
		t.Fatalf("%s: args %q, want run --config FILE", d.Name, c.Args)
	}
	if vol, key := mountedFile(t, d, c.Args[2]); vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name || cm.Data[key] == "" {
		t.Errorf("%s: %s is not the config.yaml of ConfigMap %s", d.Name, c.Args[2], cm.Name)
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// configMapOf is the ConfigMap the Deployment mounts as "config".
func configMapOf(t *testing.T, d *appsv1.Deployment, o objects) *corev1.ConfigMap {
	t.Helper()
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil {
			if cm, ok := o.configMaps[v.ConfigMap.Name]; ok {
				return cm
			}
			t.Fatalf("%s mounts ConfigMap %s, which the chart does not render", d.Name, v.ConfigMap.Name)
		}
	}
	t.Fatalf("%s mounts no config volume", d.Name)
	return nil
}

// streamConfig parses a ConfigMap's config.yaml as plain YAML.
func streamConfig(t *testing.T, cm *corev1.ConfigMap) map[string]any {
	t.Helper()
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("%s: config.yaml: %v", cm.Name, err)
	}
	return cfg
}

// get is a string setting of a config ("" when absent).
func get(cfg map[string]any, section, key string) string {
	sec, _ := cfg[section].(map[string]any)
	v, ok := sec[key]
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// mountedFile finds the volume a file path of the container lies in and
// the file's name within it.
func mountedFile(t *testing.T, d *appsv1.Deployment, file string) (corev1.Volume, string) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(m.MountPath) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: %s is mounted writable", d.Name, m.MountPath)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name {
				return v, path.Base(file)
			}
		}
	}
	t.Fatalf("%s: no volume mounted for %s", d.Name, file)
	return corev1.Volume{}, ""
}

// dockerfileUser is the numeric user the image runs as.
func dockerfileUser(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(repoPath("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER\s+(\d+)(:\d+)?\s*$`).FindAllStringSubmatch(string(data), -1)
	if len(m) == 0 {
		t.Fatal("the Dockerfile names no numeric USER: Kubernetes cannot check runAsNonRoot against a user name")
	}
	uid, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	return uid
}

func checkSecurity(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod security context %+v, want runAsNonRoot, a non-zero runAsUser and seccomp RuntimeDefault", d.Name, psc)
	} else if uid := dockerfileUser(t); *psc.RunAsUser != uid {
		t.Errorf("%s: runAsUser %d, but the image's user is %d", d.Name, *psc.RunAsUser, uid)
	}
	sc := pod.Containers[0].SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Privileged != nil && *sc.Privileged ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: container security context %+v, want no privilege escalation, a read-only root and every capability dropped", d.Name, sc)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: the pods get a service account token; pgoutbox never calls the Kubernetes API", d.Name)
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Errorf("%s: service links on: Kubernetes would add PGOUTBOX_-prefixed variables for Services named pgoutbox-*", d.Name)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("%s: the pods share a host namespace", d.Name)
	}
}

func checkResources(t *testing.T, d *appsv1.Deployment, c corev1.Container) {
	t.Helper()
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if req.Value() < measuredPeakRSS {
		t.Errorf("%s: memory request %s is below the measured peak RSS (%d bytes)", d.Name, req, measuredPeakRSS)
	}
	if lim.IsZero() || lim.Value() < 2*measuredPeakRSS {
		t.Errorf("%s: memory limit %s: want at least twice the measured peak RSS (%d bytes)", d.Name, lim, measuredPeakRSS)
	}
	if c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("%s: no CPU request", d.Name)
	}
	percent := int64(chartDefault(t, "goMemLimitPercent").(float64))
	want := fmt.Sprintf("%dMiB", lim.Value()*percent/100/(1<<20))
	var got string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			got = e.Value
		}
	}
	if got != want {
		t.Errorf("%s: GOMEMLIMIT %q, want %q (%d%% of the memory limit %s)", d.Name, got, want, percent, lim)
	}
	if q, err := resource.ParseQuantity(strings.TrimSuffix(got, "B")); err != nil || q.Cmp(*lim) >= 0 {
		t.Errorf("%s: GOMEMLIMIT %q is not below the limit %s", d.Name, got, lim)
	}
}

// checkEnv allows only the variables the chart means to set: the memory
// limit, and a DSN taken from a Secret, never a literal value that could
// hold a password.
func checkEnv(t *testing.T, d *appsv1.Deployment, c corev1.Container) {
	t.Helper()
	if len(c.EnvFrom) > 0 {
		t.Errorf("%s: envFrom %+v would put whole Secrets or ConfigMaps into the environment", d.Name, c.EnvFrom)
	}
	for _, e := range c.Env {
		switch {
		case e.Name == "GOMEMLIMIT" && e.ValueFrom == nil:
		case e.Name == "PGOUTBOX_POSTGRES_DSN" && e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
		default:
			t.Errorf("%s: environment variable %+v: the chart sets only GOMEMLIMIT and a PGOUTBOX_POSTGRES_DSN from a Secret", d.Name, e)
		}
		if strings.Contains(strings.ToUpper(e.Name), "PASSWORD") {
			t.Errorf("%s: a password in the environment: %s", d.Name, e.Name)
		}
	}
}

// checkNoPasswordInConfig fails on any password in a ConfigMap: the
// password options, a password in the DSN, or one in a connector JSON.
func checkNoPasswordInConfig(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	cfg := streamConfig(t, cm)
	for _, k := range [][2]string{{"postgres", "password"}, {"kafka", "sasl.password"}} {
		if get(cfg, k[0], k[1]) != "" {
			t.Errorf("ConfigMap %s sets %s.%s", cm.Name, k[0], k[1])
		}
	}
	if dsn := get(cfg, "postgres", "dsn"); dsn != "" {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Errorf("ConfigMap %s: postgres.dsn is not a URL: %v", cm.Name, err)
		} else if _, has := u.User.Password(); has || u.Query().Has("password") {
			t.Errorf("ConfigMap %s: postgres.dsn carries a password", cm.Name)
		}
	}
	if js, ok := cm.Data["connector.json"]; ok {
		var conn map[string]any
		if err := yaml.Unmarshal([]byte(js), &conn); err != nil {
			t.Fatalf("ConfigMap %s: connector.json: %v", cm.Name, err)
		}
		inner, _ := conn["config"].(map[string]any)
		if _, has := conn["database.password"]; has {
			t.Errorf("ConfigMap %s: connector.json holds database.password", cm.Name)
		}
		if _, has := inner["database.password"]; has {
			t.Errorf("ConfigMap %s: connector.json holds database.password", cm.Name)
		}
	}
	for key := range cm.Data {
		if key != "config.yaml" && key != "connector.json" {
			t.Errorf("ConfigMap %s: unexpected key %s", cm.Name, key)
		}
	}
}

// checkPasswordFiles: every password file the config names is a key of a
// Secret mounted read-only where the config says.
func checkPasswordFiles(t *testing.T, d *appsv1.Deployment, cm *corev1.ConfigMap) {
	t.Helper()
	cfg := streamConfig(t, cm)
	for _, k := range [][2]string{{"postgres", "password.file"}, {"kafka", "sasl.password.file"}} {
		file := get(cfg, k[0], k[1])
		if file == "" {
			continue
		}
		vol, name := mountedFile(t, d, file)
		if vol.Secret == nil || vol.Secret.SecretName == "" {
			t.Errorf("%s: %s.%s %s is not in a Secret", d.Name, k[0], k[1], file)
			continue
		}
		found := false
		for _, it := range vol.Secret.Items {
			found = found || it.Path == name
		}
		if !found {
			t.Errorf("%s: Secret volume %s has no item %s", d.Name, vol.Name, name)
		}
		if m := vol.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
			t.Errorf("%s: Secret volume %s is readable by others (mode %v)", d.Name, vol.Name, m)
		}
	}
}

func checkPDB(t *testing.T, p *policyv1.PodDisruptionBudget, d *appsv1.Deployment, o objects) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil {
		t.Fatalf("%s: PDB selector: %v", p.Name, err)
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("PDB %s does not select the pods of %s", p.Name, d.Name)
	}
	for _, other := range o.deployments {
		if other.Name != d.Name && sel.Matches(labels.Set(other.Spec.Template.Labels)) {
			t.Errorf("PDB %s also selects the pods of %s", p.Name, other.Name)
		}
	}
	// maxUnavailable, not minAvailable: a budget of "one ready pod" would
	// block a drain for good whenever the other pod is down.
	if p.Spec.MinAvailable != nil || p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB %s: minAvailable %v, maxUnavailable %v; want maxUnavailable 1 only", p.Name, p.Spec.MinAvailable, p.Spec.MaxUnavailable)
	}
	if pol := p.Spec.UnhealthyPodEvictionPolicy; pol == nil || *pol != policyv1.AlwaysAllow {
		t.Errorf("PDB %s: unhealthyPodEvictionPolicy %v, want AlwaysAllow", p.Name, pol)
	}
}

// checkNames applies the API server's rules on names and labels.
func checkNames(t *testing.T, name string, sets ...map[string]string) {
	t.Helper()
	for _, msg := range validation.IsDNS1123Label(name) {
		t.Errorf("name %s: %s", name, msg)
	}
	for _, set := range sets {
		for k, v := range set {
			for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
				t.Errorf("%s: label %s=%s: %s", name, k, v, msg)
			}
		}
	}
}

// checkMonitoring: the Service lists every pod of the release, the
// ServiceMonitor selects the Service's metrics port and labels each series
// with its stream, and the rules' selector matches the job that gives.
func checkMonitoring(t *testing.T, o objects, vals map[string]any) {
	t.Helper()
	if len(o.services) > 1 || len(o.serviceMonitors) > 1 || len(o.rules) > 1 {
		t.Fatalf("%d Services, %d ServiceMonitors, %d PrometheusRules; want one of each at most", len(o.services), len(o.serviceMonitors), len(o.rules))
	}
	if len(o.serviceMonitors) == 1 && len(o.services) == 0 {
		t.Fatal("a ServiceMonitor without a Service to select")
	}
	if len(o.services) == 1 {
		svc := o.services[0]
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s: want headless with not-ready addresses published", svc.Name)
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		for _, d := range o.deployments {
			if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("Service %s does not select the pods of %s", svc.Name, d.Name)
			}
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
			t.Errorf("Service %s: ports %+v, want one named metrics to the pods' metrics port", svc.Name, svc.Spec.Ports)
		}
		for _, sm := range o.serviceMonitors {
			smSel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			if err != nil || !smSel.Matches(labels.Set(svc.Labels)) {
				t.Errorf("ServiceMonitor %s does not select Service %s (%v)", sm.Name, svc.Name, err)
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
				t.Fatalf("ServiceMonitor %s: endpoints %+v, want the metrics port", sm.Name, sm.Spec.Endpoints)
			}
			streamLabel := false
			for _, r := range sm.Spec.Endpoints[0].RelabelConfigs {
				streamLabel = streamLabel || r.TargetLabel == "stream" &&
					slices.Equal(r.SourceLabels, []monitoringv1.LabelName{"__meta_kubernetes_pod_label_pgoutbox_io_stream"})
			}
			if !streamLabel {
				t.Errorf("ServiceMonitor %s does not label the series with their stream", sm.Name)
			}
			for _, d := range o.deployments {
				if d.Spec.Template.Labels["pgoutbox.io/stream"] != d.Name {
					t.Errorf("%s: pod label pgoutbox.io/stream is %q, want the Deployment's name", d.Name, d.Spec.Template.Labels["pgoutbox.io/stream"])
				}
			}
			// The job is the Service's name; the default rule selector
			// must ask for it.
			if p, _ := vals["prometheusRule"].(map[string]any); p["selector"] == nil && len(o.rules) == 1 {
				if !strings.Contains(o.rules[0].Spec.Groups[0].Rules[0].Expr.String(), fmt.Sprintf("job=%q", svc.Name)) {
					t.Errorf("the alert rules do not select job=%q, the job the ServiceMonitor gives", svc.Name)
				}
			}
		}
	}
}
