// Command check holds the walpost Helm chart to Helm and to the Kubernetes API types,
// without a cluster (scripts/check-chart.sh runs it from the repository's root):
//
//  1. one source: the chart's copies of deploy/prometheus/alerts.yml and
//     deploy/grafana/walpost-dashboard.json are byte-for-byte the originals (Helm reads no
//     file outside a chart, so the chart carries copies);
//  2. `helm lint` (Helm's own lint package, strict: a warning fails) with the default
//     values and with each ci/*-values.yaml;
//  3. `helm template` (the same values merging, schema validation and engine as
//     `helm install`) of the same values; every rendered object is decoded strictly
//     (unknown or duplicate fields fail, names are case-sensitive) into its Kubernetes API
//     type, or the prometheus-operator type for ServiceMonitor and PrometheusRule;
//  4. what the chart promises: every container non-root, read-only root filesystem, no
//     privilege escalation, capabilities dropped, seccomp RuntimeDefault; probes on
//     /healthz and /readyz of a declared port; a grace period above walpost's shutdown
//     timeout; selectors, volumes, ports and services that point at something; no Secret
//     object and no secret value anywhere; the PrometheusRule equal to alerts.yml;
//  5. refusals: each testdata/refused/*.yaml must fail the render with the message its
//     `# expect:` line names, and never print the sentinel password it carries.
//
// Exit 0 when everything holds; otherwise every failure is printed and it exits 1.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
)

// sentinel is the password the refused cases carry: it must appear in no output.
const sentinel = "s3ntinel-Pa55word"

type checker struct {
	failures []string
}

func (c *checker) fail(format string, args ...any) {
	c.failures = append(c.failures, fmt.Sprintf(format, args...))
}

func main() {
	chartDir := flag.String("chart", "deploy/helm/walpost", "the chart")
	alerts := flag.String("alerts", "deploy/prometheus/alerts.yml", "the one source of the alerting rules")
	dashboard := flag.String("dashboard", "deploy/grafana/walpost-dashboard.json", "the one source of the dashboard")
	configDoc := flag.String("configuration", "docs/configuration.md", "walpost's configuration reference (variables, shutdown timeout)")
	refused := flag.String("refused", "deploy/helm/check/testdata/refused", "values files the chart must refuse")
	out := flag.String("out", "", "also write each render's manifests into this directory (to read them)")
	flag.Parse()

	fmt.Fprintf(os.Stderr, "check-chart: %s; rendering for Kubernetes %s\n", versions(), newestKube)
	c := &checker{}
	c.oneSource(filepath.Join(*chartDir, "files", "alerts.yml"), *alerts)
	c.oneSource(filepath.Join(*chartDir, "files", "walpost-dashboard.json"), *dashboard)

	doc, err := loadConfigDoc(*configDoc)
	if err != nil {
		c.fail("%v", err)
	}

	// The default values, then every CI values file.
	cases := []string{""}
	ci, _ := filepath.Glob(filepath.Join(*chartDir, "ci", "*-values.yaml"))
	sort.Strings(ci)
	cases = append(cases, ci...)
	r, err := newRenderer(*chartDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "check-chart: FAIL: %v\n", err)
		os.Exit(1)
	}
	var allOn []object
	for _, file := range cases {
		name := "default values"
		if file != "" {
			name = filepath.Base(file)
		}
		c.lint(*chartDir, file, name)
		objects := c.renderAndDecode(r, file, name)
		if objects == nil {
			continue
		}
		c.checkObjects(name, objects, doc, *alerts, *dashboard)
		if *out != "" {
			c.write(*out, name, objects)
		}
		if file == "" {
			c.checkDefaults(objects)
		}
		if strings.HasSuffix(file, "all-on-values.yaml") {
			allOn = objects
		}
		fmt.Fprintf(os.Stderr, "check-chart: %s: lint clean, %d objects rendered and decoded strictly\n", name, len(objects))
	}
	if allOn == nil {
		c.fail("ci/all-on-values.yaml: missing, or its render failed (above)")
	} else {
		c.checkAllOn(allOn)
	}
	c.checkSchemaTakesNoSecret(filepath.Join(*chartDir, "values.schema.json"))
	c.refusals(r, *refused)

	if len(c.failures) > 0 {
		for _, f := range c.failures {
			fmt.Fprintf(os.Stderr, "check-chart: FAIL: %s\n", f)
		}
		fmt.Fprintf(os.Stderr, "check-chart: %d failure(s)\n", len(c.failures))
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "check-chart: all checks passed")
}

// oneSource fails unless the chart's copy is byte-for-byte the original.
func (c *checker) oneSource(copyPath, original string) {
	a, err := os.ReadFile(copyPath)
	if err != nil {
		c.fail("%v", err)
		return
	}
	b, err := os.ReadFile(original)
	if err != nil {
		c.fail("%v", err)
		return
	}
	if string(a) != string(b) {
		c.fail("%s differs from %s, its one source: cp %s %s", copyPath, original, original, copyPath)
	}
}

// versions names the modules the checks come from, as built.
func versions() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "versions unknown"
	}
	var out []string
	for _, m := range info.Deps {
		switch m.Path {
		case "helm.sh/helm/v4", "k8s.io/api", "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring":
			out = append(out, m.Path+" "+m.Version)
		}
	}
	return strings.Join(out, ", ")
}

// write puts one render's objects into dir/<case>.yaml.
func (c *checker) write(dir, name string, objects []object) {
	var b strings.Builder
	for _, o := range objects {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", o.template, strings.TrimSpace(o.yaml))
	}
	file := filepath.Join(dir, strings.TrimSuffix(strings.ReplaceAll(name, " ", "-"), ".yaml")+".yaml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.fail("%v", err)
		return
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		c.fail("%v", err)
	}
}
