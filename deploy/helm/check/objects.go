package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// configDoc is what docs/configuration.md says: the variables walpost reads and the
// default of [pipeline] shutdown_timeout_secs.
type configDoc struct {
	vars            map[string]bool
	shutdownTimeout int
}

var (
	docVariable = regexp.MustCompile(`WALPOST_[A-Z0-9_]+`)
	docShutdown = regexp.MustCompile("\\| `pipeline\\.shutdown_timeout_secs` \\| ([0-9]+) \\|")
	// The secret librdkafka properties, each readable from WALPOST_KAFKA_<PROPERTY>
	// (docs/configuration.md names the pattern, `WALPOST_KAFKA_<PROPERTY>`).
	kafkaSecretVars = []string{"WALPOST_KAFKA_SASL_PASSWORD", "WALPOST_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
		"WALPOST_KAFKA_SSL_KEY_PASSWORD", "WALPOST_KAFKA_SSL_KEYSTORE_PASSWORD", "WALPOST_KAFKA_SSL_KEY_PEM"}
)

func loadConfigDoc(file string) (configDoc, error) {
	d := configDoc{vars: map[string]bool{}}
	text, err := os.ReadFile(file)
	if err != nil {
		return d, err
	}
	for _, v := range docVariable.FindAllString(string(text), -1) {
		d.vars[v] = true
	}
	for _, v := range kafkaSecretVars {
		d.vars[v] = true
	}
	m := docShutdown.FindStringSubmatch(string(text))
	if m == nil {
		return d, fmt.Errorf("%s: no row for pipeline.shutdown_timeout_secs with its default", file)
	}
	d.shutdownTimeout, _ = strconv.Atoi(m[1])
	return d, nil
}

func (d configDoc) reads(name string) bool { return d.vars[name] }

func selectorOf(s *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

// checkObjects holds one render's objects to the chart's promises and to each other.
func (c *checker) checkObjects(where string, objects []object, doc configDoc, alertsPath, dashboardPath string) {
	var pods []pod
	services := map[string]*corev1.Service{}
	configMaps := map[string]*corev1.ConfigMap{}
	serviceAccounts := map[string]bool{}
	names := map[string]bool{}
	for _, o := range objects {
		id := o.head.String()
		if names[id] {
			c.fail("%s: %s rendered twice", where, id)
		}
		names[id] = true
		c.checkMeta(where, o)
		if p, ok := podOf(o); ok {
			pods = append(pods, p)
			c.checkPod(where, p, doc)
		}
		switch t := o.typed.(type) {
		case *corev1.Service:
			services[t.Name] = t
		case *corev1.ConfigMap:
			configMaps[t.Name] = t
			c.checkConfigMap(where, t, dashboardPath)
		case *corev1.ServiceAccount:
			serviceAccounts[t.Name] = true
		case *appsv1.Deployment:
			c.checkDeployment(where, t, doc)
		case *batchv1.Job:
			if hook := t.Annotations["helm.sh/hook"]; !strings.Contains(hook, "pre-install") || !strings.Contains(hook, "pre-upgrade") {
				c.fail("%s: %s: not a pre-install and pre-upgrade hook (helm.sh/hook=%q)", where, o.head, hook)
			}
		case *monitoringv1.PrometheusRule:
			c.checkRules(where, t, alertsPath)
		}
	}
	// What points at something must find it.
	for _, p := range pods {
		if sa := p.spec.ServiceAccountName; sa != "" && !serviceAccounts[sa] && sa != "default" {
			c.fail("%s: %s runs as service account %s, which is not rendered", where, p.owner, sa)
		}
		for _, v := range p.spec.Volumes {
			if v.ConfigMap != nil && strings.HasPrefix(v.ConfigMap.Name, releaseName+"-") && configMaps[v.ConfigMap.Name] == nil {
				c.fail("%s: %s mounts ConfigMap %s, which is not rendered", where, p.owner, v.ConfigMap.Name)
			}
		}
	}
	matching := func(sel labels.Selector) []pod {
		var out []pod
		for _, p := range pods {
			if sel.Matches(labels.Set(p.labels)) {
				out = append(out, p)
			}
		}
		return out
	}
	for _, o := range objects {
		switch t := o.typed.(type) {
		case *policyv1.PodDisruptionBudget:
			if len(matching(selectorOf(t.Spec.Selector))) == 0 {
				c.fail("%s: %s selects no pod", where, o.head)
			}
		case *corev1.Service:
			sel := labels.SelectorFromSet(t.Spec.Selector)
			ps := matching(sel)
			if len(t.Spec.Selector) == 0 || len(ps) == 0 {
				c.fail("%s: %s selects no pod", where, o.head)
				continue
			}
			for _, port := range t.Spec.Ports {
				if !hasPort(ps[0], port.TargetPort.StrVal) {
					c.fail("%s: %s port %s targets %q, not a named port of %s", where, o.head, port.Name, port.TargetPort.String(), ps[0].owner)
				}
			}
		case *monitoringv1.ServiceMonitor:
			sel := selectorOf(&t.Spec.Selector)
			found := false
			for _, s := range services {
				if sel.Matches(labels.Set(s.Labels)) {
					found = true
					for _, ep := range t.Spec.Endpoints {
						if !serviceHasPort(s, ep.Port) {
							c.fail("%s: %s scrapes port %q, which Service %s does not have", where, o.head, ep.Port, s.Name)
						}
					}
				}
			}
			if !found {
				c.fail("%s: %s selects no Service", where, o.head)
			}
		case *networkingv1.NetworkPolicy:
			ps := matching(selectorOf(&t.Spec.PodSelector))
			if len(ps) == 0 {
				c.fail("%s: %s selects no pod", where, o.head)
				continue
			}
			for _, rule := range t.Spec.Ingress {
				for _, port := range rule.Ports {
					if port.Port == nil || !hasPort(ps[0], port.Port.StrVal) {
						c.fail("%s: %s opens a port that is not a named port of %s", where, o.head, ps[0].owner)
					}
				}
			}
		}
	}
}

func hasPort(p pod, name string) bool {
	for _, ct := range p.spec.Containers {
		for _, port := range ct.Ports {
			if port.Name == name && name != "" {
				return true
			}
		}
	}
	return false
}

func serviceHasPort(s *corev1.Service, name string) bool {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// checkMeta: names and labels the API server would take.
func (c *checker) checkMeta(where string, o object) {
	name := o.head.Metadata.Name
	var problems []string
	switch o.head.Kind {
	case "Service":
		problems = validation.IsDNS1035Label(name)
	case "CronJob":
		// Its Jobs are named <name>-<11 digits>, which must stay a label.
		if len(name) > 52 {
			problems = append(problems, "longer than 52 characters")
		}
		problems = append(problems, validation.IsDNS1123Subdomain(name)...)
	default:
		problems = validation.IsDNS1123Subdomain(name)
	}
	for _, p := range problems {
		c.fail("%s: %s: name: %s", where, o.head, p)
	}
	for _, err := range metavalidation.ValidateLabels(o.head.Metadata.Labels, field.NewPath("metadata", "labels")) {
		c.fail("%s: %s: %v", where, o.head, err)
	}
	if p, ok := podOf(o); ok {
		for _, err := range metavalidation.ValidateLabels(p.labels, field.NewPath("template", "metadata", "labels")) {
			c.fail("%s: %s: %v", where, o.head, err)
		}
	}
	if strings.Contains(o.yaml, sentinel) {
		c.fail("%s: %s holds the sentinel password", where, o.head)
	}
}

func (c *checker) checkDeployment(where string, d *appsv1.Deployment, doc configDoc) {
	at := where + ": Deployment/" + d.Name
	if d.Spec.Selector == nil || !selectorOf(d.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		c.fail("%s: the selector does not match the pod template's labels", at)
	}
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || *grace <= int64(doc.shutdownTimeout) {
		c.fail("%s: terminationGracePeriodSeconds is not above walpost's shutdown timeout (%d s)", at, doc.shutdownTimeout)
	}
	main := d.Spec.Template.Spec.Containers[0]
	probes := map[string]*corev1.Probe{"/healthz": main.LivenessProbe, "/readyz": main.ReadinessProbe}
	for path, probe := range probes {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path {
			c.fail("%s: no probe on %s", at, path)
		}
	}
}

// checkConfigMap: walpost.toml is TOML; the dashboard is the dashboard.
func (c *checker) checkConfigMap(where string, cm *corev1.ConfigMap, dashboardPath string) {
	if text, ok := cm.Data["walpost.toml"]; ok {
		var v map[string]any
		if _, err := toml.Decode(text, &v); err != nil {
			c.fail("%s: ConfigMap/%s: walpost.toml is not TOML: %v", where, cm.Name, err)
		}
	}
	if text, ok := cm.Data["walpost-dashboard.json"]; ok {
		original, err := os.ReadFile(dashboardPath)
		if err != nil {
			c.fail("%v", err)
			return
		}
		if strings.TrimRight(text, "\n") != strings.TrimRight(string(original), "\n") {
			c.fail("%s: ConfigMap/%s: the dashboard is not %s", where, cm.Name, dashboardPath)
		}
		var v any
		if err := json.Unmarshal([]byte(text), &v); err != nil {
			c.fail("%s: ConfigMap/%s: the dashboard is not JSON: %v", where, cm.Name, err)
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			c.fail("%s: ConfigMap/%s: no grafana_dashboard: \"1\" label for Grafana's sidecar", where, cm.Name)
		}
	}
}

// checkRules: the PrometheusRule holds exactly alerts.yml's groups, decoded strictly into
// the operator's type.
func (c *checker) checkRules(where string, r *monitoringv1.PrometheusRule, alertsPath string) {
	text, err := os.ReadFile(alertsPath)
	if err != nil {
		c.fail("%v", err)
		return
	}
	data, err := strictJSON(text)
	if err != nil {
		c.fail("%s: %v", alertsPath, err)
		return
	}
	var spec monitoringv1.PrometheusRuleSpec
	if err := strictDecode(data, &spec); err != nil {
		c.fail("%s does not decode strictly as a PrometheusRule spec: %v", alertsPath, err)
		return
	}
	if len(spec.Groups) == 0 || !reflect.DeepEqual(spec, r.Spec) {
		c.fail("%s: PrometheusRule/%s: its groups are not those of %s", where, r.Name, alertsPath)
	}
}
