package main

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
)

const (
	releaseName = "walpost"
	namespace   = "streaming"
	// The oldest Kubernetes the chart claims (Chart.yaml kubeVersion).
	oldestKube = "v1.27.0"
)

// newestKube is the Kubernetes whose API types this program decodes into: k8s.io/api
// v0.N.x is Kubernetes 1.N.
var newestKube = func() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			var minor int
			if m.Path == "k8s.io/api" {
				if _, err := fmt.Sscanf(m.Version, "v0.%d.", &minor); err == nil {
					return fmt.Sprintf("v1.%d.0", minor)
				}
			}
		}
	}
	return "v1.36.0"
}()

type renderer struct {
	chart *chart.Chart
	caps  *common.Capabilities
}

func newRenderer(dir string) (*renderer, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading the chart %s: %w", dir, err)
	}
	for _, v := range []string{oldestKube, newestKube} {
		if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, v) {
			return nil, fmt.Errorf("Chart.yaml kubeVersion %q does not take Kubernetes %s", ch.Metadata.KubeVersion, v)
		}
	}
	kv, err := common.ParseKubeVersion(newestKube)
	if err != nil {
		return nil, err
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	return &renderer{chart: ch, caps: caps}, nil
}

func readValues(file string) (map[string]any, error) {
	if file == "" {
		return map[string]any{}, nil
	}
	v, err := common.ReadValuesFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return v, nil
}

// render is `helm template`: the chart's values under the file's, the schema, the engine.
// It returns the rendered files by template path (NOTES.txt rendered, then left out).
func (r *renderer) render(file string) (map[string]string, error) {
	vals, err := readValues(file)
	if err != nil {
		return nil, err
	}
	if err := chartutil.ProcessDependencies(r.chart, vals); err != nil {
		return nil, err
	}
	options := common.ReleaseOptions{Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true}
	top, err := util.ToRenderValuesWithSchemaValidation(r.chart, vals, options, r.caps, false)
	if err != nil {
		return nil, err
	}
	var e engine.Engine
	files, err := e.RenderWithContext(context.Background(), r.chart, top)
	if err != nil {
		return nil, err
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	return files, nil
}

// lint is `helm lint --strict`: a warning or an error fails.
func (c *checker) lint(dir, file, name string) {
	vals, err := readValues(file)
	if err != nil {
		c.fail("%v", err)
		return
	}
	kv, err := common.ParseKubeVersion(newestKube)
	if err != nil {
		c.fail("%v", err)
		return
	}
	result := lint.RunAll(dir, vals, namespace, lint.WithKubeVersion(kv))
	for _, m := range result.Messages {
		if m.Severity >= support.WarningSev {
			c.fail("helm lint (%s): %s", name, m.Error())
		}
	}
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// documents splits rendered files into YAML documents, in a stable order, dropping the
// empty ones (a template whose condition is off) as Helm does.
func documents(files map[string]string) []object {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []object
	for _, n := range names {
		for _, doc := range docSeparator.Split(files[n], -1) {
			if onlyComments(doc) {
				continue
			}
			out = append(out, object{template: path.Base(n), yaml: doc})
		}
	}
	return out
}

func onlyComments(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		t := strings.TrimSpace(line)
		if t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}

// renderAndDecode renders one values file and decodes every object strictly. nil when
// it failed (the failures are recorded).
func (c *checker) renderAndDecode(r *renderer, file, name string) []object {
	files, err := r.render(file)
	if err != nil {
		c.fail("helm template (%s): %v", name, err)
		return nil
	}
	objects := documents(files)
	ok := true
	for i := range objects {
		if err := objects[i].decode(); err != nil {
			c.fail("%s: %s: %v", name, objects[i].template, err)
			ok = false
		}
	}
	if !ok {
		return nil
	}
	return objects
}

// refusals renders each refused values file over the chart's defaults: it must fail with
// its `# expect:` text, and neither the error nor any output may hold the sentinel.
func (c *checker) refusals(r *renderer, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	sort.Strings(files)
	if len(files) == 0 {
		c.fail("no refused values files in %s", dir)
		return
	}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			c.fail("%v", err)
			continue
		}
		expect := ""
		for _, line := range strings.Split(string(text), "\n") {
			if after, found := strings.CutPrefix(line, "# expect: "); found {
				expect = strings.TrimSpace(after)
			}
		}
		if expect == "" {
			c.fail("%s: no `# expect: <text of the error>` line", f)
			continue
		}
		rendered, err := r.render(f)
		if err == nil {
			all := ""
			for _, v := range rendered {
				all += v
			}
			leak := ""
			if strings.Contains(all, sentinel) {
				leak = " and the sentinel password is in the manifests"
			}
			c.fail("%s: rendered without error (want one containing %q)%s", f, expect, leak)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, expect) {
			c.fail("%s: the error does not say %q:\n%s", f, expect, msg)
		}
		if strings.Contains(msg, sentinel) {
			c.fail("%s: the error prints the sentinel password", f)
		}
		fmt.Fprintf(os.Stderr, "check-chart: refused as expected: %s (%s)\n", path.Base(f), expect)
	}
}
